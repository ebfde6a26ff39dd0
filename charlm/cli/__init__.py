"""The `charlm` command line (Typer): each command parses and checks its flags, calls the library and prints; no ML
logic lives here. Also what only a terminal needs: the interactive sampler (repl), end-of-command reports, plots and
the SIGINT/SIGTERM handling around a run.

The top of the package: may import everything; nothing imports it but `python -m charlm` and the console script.
"""
