"""Experiments and benchmarks of jaxsal (scripts: `python -m experiments.<name>`)."""
