"""`python -m interlude_tools`: one tool worker (`cli.py`), once the `tools` extra is here;
without it, one line says what to install (exit 2)."""

import sys

from interlude.extras import missing, say_missing

if absent := missing("tools"):
    sys.exit(say_missing("python -m interlude_tools", ("tools",), absent))

# Imported only once the extra is known to be here.
from interlude_tools.cli import app

app()
