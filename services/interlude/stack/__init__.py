"""The one-machine stack (`interlude up` / `interlude down`): the embedded Redis-compatible
server (`valkey.py`), supervised child processes (`procs.py`) and the stack itself (`up.py`)."""
