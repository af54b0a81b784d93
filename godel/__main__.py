"""`python -m godel`: the `godel` command line."""

from godel.cli.main import main

main()
