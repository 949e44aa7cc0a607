"""Experiments and benchmarks of jaxsal, one package per study (`python -m experiments.<study>.<script>`)."""
