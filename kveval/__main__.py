"""`python -m kveval`: the same command line as `kveval`."""
from kveval.cli.commands import main

main()
