"""Valkey ACL users, one per component: each may run only the commands, on only the keys, that
its code runs (read off the code; each grant names where). The one source of these rules: the
chart renders its ACL file from `template()` (committed as charts/interlude/files/, checked
equal by tests/chart) and tests/bus/test_acl.py runs the real engine, worker and gateway code
under `acl_file()`.

Valkey selectors, `(~keys +commands)`, tie a command to the keys it may touch: the worker XADDs
to result streams but not to the call stream, the engine the other way round. A script's EVAL
is checked against the keys it declares, and each `redis.call` inside it again as a command of
its own, so the scripts need both their EVAL grant and grants for what they call.

Standard library only (`interlude.api` holds the key names): anything can import this.
"""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass

from interlude.api.bus import (
    CALL_STREAM,
    DEAD_LETTER_STREAM,
    DONE_KEY_PREFIX,
    RESULT_STREAM_PREFIX,
    SUBMITTED_KEY_PREFIX,
)
from interlude.api.tools import KEY as TOOLS_KEY

# Key prefixes of code outside this package, repeated here so that this module imports nothing
# but `interlude.api`; tests/bus/test_acl.py checks them against their owners.
TEXTWORLD_PREFIX = "interlude:textworld:"  # interlude_tools.tools.textworld.KEY_PREFIX
RATE_LIMIT_PREFIX = "interlude:rl:"  # interlude.gateway.quota.KEY_PREFIX

ADMIN = "default"  # Valkey's own user: every right, for operators and the readiness probe


@dataclass(frozen=True)
class Grant:
    """Commands (`+name` or `+name|subcommand`) and, if they touch keys, the glob patterns they
    may touch; `why` names the code that runs them (paths under services/interlude/ and
    tools-svc/interlude_tools/)."""

    commands: tuple[str, ...]
    keys: tuple[str, ...]
    why: str

    def rule(self) -> str:
        allowed = " ".join(f"+{c}" for c in self.commands)
        if not self.keys:  # keyless commands: the user's root permissions
            return allowed
        return "(" + " ".join(f"~{k}" for k in self.keys) + f" {allowed})"


RESULTS = f"{RESULT_STREAM_PREFIX}*"
DONE = f"{DONE_KEY_PREFIX}*"

# redis-py sends CLIENT SETINFO on every new connection (and ignores a refusal, though the ACL
# LOG would list it). HELLO and AUTH need no grant.
_HANDSHAKE = Grant(("client|setinfo",), (), "the clients' connection handshake")

USERS: dict[str, tuple[Grant, ...]] = {
    "engine": (
        _HANDSHAKE,
        Grant(
            ("xgroup|create", "xreadgroup", "xack", "xdel"),
            (RESULTS,),
            "bus/engine_side.py EngineBus: start (ensure_group), _read, ack, ack_and_delete",
        ),
        Grant(
            ("eval",),
            (f"{SUBMITTED_KEY_PREFIX}*", CALL_STREAM),
            "bus/engine_side.py EngineBus.submit: the _SUBMIT script's declared keys",
        ),
        Grant(("set",), (f"{SUBMITTED_KEY_PREFIX}*",), "_SUBMIT: SET NX EX"),
        Grant(("xadd",), (CALL_STREAM,), "_SUBMIT: XADD MAXLEN ~"),
        Grant(
            ("hgetall",),
            (TOOLS_KEY,),
            "bus/published.py published (engine/tools.py PublishedTools)",
        ),
    ),
    "tools": (
        _HANDSHAKE,
        Grant(
            ("xgroup|create", "xreadgroup", "xpending", "xclaim", "xack", "xdel", "xinfo|groups"),
            (CALL_STREAM,),
            "bus/worker_side.py WorkerBus: setup, read, idle, claim, skip; bus/heartbeat.py beat "
            "(XCLAIM JUSTID); "
            "observe.py read_bus (XPENDING, XINFO GROUPS)",
        ),
        Grant(
            ("eval",),
            # The empty key: bus/dead_letter.py passes "" for an undecodable call's done key and
            # result stream (there is no engine to answer).
            (DONE, RESULTS, CALL_STREAM, DEAD_LETTER_STREAM, ""),
            "bus/worker_side.py _POST and bus/dead_letter.py _DEAD: the scripts' declared keys",
        ),
        Grant(("exists", "set"), (DONE,), "WorkerBus.answered (EXISTS); _POST, _DEAD: SET NX EX"),
        Grant(("xadd", "expire"), (RESULTS,), "_POST, _DEAD: XADD the result, EXPIRE its stream"),
        Grant(("xadd",), (DEAD_LETTER_STREAM,), "_DEAD: XADD MAXLEN ~"),
        Grant(("hset",), (TOOLS_KEY,), "__main__.py _publish (bus/published.py publish)"),
        Grant(
            ("get", "set", "watch"),
            (f"{TEXTWORLD_PREFIX}*",),
            "textworld.py SessionStore: load, step (WATCH, GET, SET PX inside MULTI)",
        ),
        Grant(
            ("multi", "exec", "unwatch"),
            (),
            "textworld.py step's transaction; leaving it still watching (a call id played "
            "before) makes redis-py's pipeline reset send UNWATCH",
        ),
    ),
    "gateway": (
        _HANDSHAKE,
        Grant(
            ("evalsha",),
            (f"{RATE_LIMIT_PREFIX}*",),
            "gateway/quota.py RedisQuota.lease: the _LEASE script's declared keys",
        ),
        Grant(("get", "incrby", "pexpire"), (f"{RATE_LIMIT_PREFIX}*",), "_LEASE: its calls"),
        Grant(("script|load",), (), "redis-py loads a script the server does not know (NOSCRIPT)"),
    ),
}

# Valkey's own processes in the chart's HA mode (redis.ha): a replica syncing from its primary
# (`masteruser`) and each sentinel watching them (`sentinel auth-user`). The rules are the ones
# the Valkey docs give for replication and for Sentinel (which sends SLAVEOF or REPLICAOF by
# version, publishes and subscribes on __sentinel__:hello, and rewrites a reconfigured node's
# config). Only HA mode has these users: a replication user reads the whole dataset.
HA_USERS: dict[str, str] = {
    "replication": "+psync +replconf +ping",
    "sentinel": "allchannels +multi +exec +slaveof +replicaof +ping +subscribe +publish +info "
    "+role +config|rewrite +client|setname +client|kill +script|kill",
}

HEADER = (
    "# Generated by `python -m interlude.bus.acl` from services/interlude/bus/acl.py: do not",
    "# edit (tests/chart checks it). The chart drops these comment lines (an ACL file has none)",
    "# and puts `#` + the SHA-256 of each user's password from its Secret for <NAME-password>.",
    # The chart reads this line: these users' lines are rendered in HA mode only.
    "# ha-only: " + " ".join(HA_USERS),
)


def users(ha: bool = False) -> list[str]:
    """Every user of the ACL file, the admin first; without `ha`, not the HA mode's."""
    return [ADMIN, *USERS, *(HA_USERS if ha else ())]


def rules(user: str) -> str:
    """A user's rules after its password: every right for the admin, else its grants alone."""
    if user == ADMIN:
        return "~* &* +@all"
    if user in HA_USERS:
        return f"resetchannels -@all {HA_USERS[user]}"
    # resetchannels -@all: start from nothing (the defaults could differ by server version).
    # Keyless grants first: the user's root rules, then its selectors.
    grants = sorted(USERS[user], key=lambda g: bool(g.keys))
    return " ".join(["resetchannels", "-@all", *(g.rule() for g in grants)])


def placeholder(user: str) -> str:
    """What stands for the user's password hash in `template()`."""
    return f"<{user}-password>"


def password_hash(password: str) -> str:
    """An ACL password rule: `#` and the SHA-256 in hex, so no password sits in the file."""
    return "#" + hashlib.sha256(password.encode()).hexdigest()


def template() -> str:
    """The committed rules file: `HEADER`, then one line per user (the HA mode's too) with its
    `placeholder`."""
    lines = [*HEADER, *(f"user {u} on {placeholder(u)} {rules(u)}" for u in users(ha=True))]
    return "\n".join(lines) + "\n"


def acl_file(passwords: Mapping[str, str], ha: bool = False) -> str:
    """The ACL file Valkey loads (`aclfile`), given a password for each of `users(ha)`."""
    missing = [u for u in users(ha) if not passwords.get(u)]
    if missing:
        raise ValueError(f"no password for ACL users {missing}")
    return "".join(f"user {u} on {password_hash(passwords[u])} {rules(u)}\n" for u in users(ha))


def main(argv: list[str]) -> int:
    """No arguments: print `template()`. `--from-env [--ha]`: print `acl_file()` with the
    passwords from INTERLUDE_REDIS_PASSWORD_<USER> (for a Secret you make yourself)."""
    if argv in (["--from-env"], ["--from-env", "--ha"]):
        ha = "--ha" in argv
        env = {u: os.environ.get(f"INTERLUDE_REDIS_PASSWORD_{u.upper()}", "") for u in users(ha)}
        try:
            sys.stdout.write(acl_file(env, ha))
        except ValueError as exc:
            sys.stderr.write(f"{exc}: set INTERLUDE_REDIS_PASSWORD_<USER> for each\n")
            return 2
        return 0
    if argv:
        sys.stderr.write("usage: python -m interlude.bus.acl [--from-env [--ha]]\n")
        return 2
    sys.stdout.write(template())
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
