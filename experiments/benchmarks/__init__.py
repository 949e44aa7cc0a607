"""Benchmarks of jaxsal: speed and memory against the torch peers, throughput, precision, the
buffer end to end, training speed, and the GPU script. README.md lists them."""
