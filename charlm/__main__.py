"""`python -m charlm`: the same command line as the `charlm` console script."""

from charlm.cli.app import main

main()
