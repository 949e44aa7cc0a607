"""The test suite, a package (as is each folder) so that test files in different folders may share a name."""
