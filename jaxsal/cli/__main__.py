"""`python -m jaxsal.cli`: the `jaxsal` command."""
from jaxsal.cli import main

main()
