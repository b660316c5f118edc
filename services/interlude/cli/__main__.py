"""`python -m interlude.cli`: the command line, as the `interlude` script runs it."""

from interlude.cli.app import main

main()
