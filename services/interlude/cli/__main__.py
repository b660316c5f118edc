"""`python -m interlude.cli`: the command line, as the `interlude` script runs it."""

from interlude.cli.root import main

main()
