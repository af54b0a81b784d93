"""The `godel` command line: a Typer app assembled from one module per command group."""
