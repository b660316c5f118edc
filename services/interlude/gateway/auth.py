"""API keys: created once, stored only as digests, checked in constant time and at constant cost.

A key reads ``il-<id>-<secret>``: the id (8 hex digits) finds the stored entry without trying
every digest, and only the secret is hashed. A keys file has one entry per line,
``<name>:<id>:sha256$<digest b64>[:tools=<names>][:sessions=<n>][:tool_calls=<n>]`` (``#``
starts a comment), so the file can be read by anyone who may see it without giving a key away.
``tools=`` lists the server-side tools the key may run (comma-separated; ``*`` every published
one; empty none); ``sessions=`` caps its live sessions and ``tool_calls=`` its server-side tool
calls in flight, on each engine (0: no cap; `api.engine.Caps`). Without one, the deployment's
default applies (the gateway's ``--default-tools``, ``--default-sessions``,
``--default-tool-calls``).

The secret holds 192 random bits, so a fast hash is safe: nobody can search that space, and
SHA-256 lets a wrong key cost the server a microsecond, not the attacker's choice of work. Every
check hashes the presented secret and compares it with `hmac.compare_digest`, against a dummy
digest when the id is unknown, so timing shows neither which ids exist nor how much of a secret
matched. Lines of the earlier ``scrypt$n$r$p$salt$hash`` form are still read (re-create those
keys: a wrong secret for one costs a scrypt, which `slow` lets the caller run off its event loop).
The file is re-read when it changes, so keys rotate without a restart.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from interlude.api.engine import tool_list
from interlude.api.names import TOOL_NAME

log = logging.getLogger(__name__)

PREFIX = "il"
SECRET_BYTES = 24  # 192 random bits
_DUMMY = hashlib.sha256(b"no such key").digest()


class KeyFileError(ValueError):
    """The keys file is malformed; the message names the line."""


@dataclass(frozen=True)
class StoredKey:
    """One keys-file entry: who it is for, the key's id and its digest (`algo` "sha256", or
    "scrypt" with its parameters `n`, `r`, `p` and `salt`)."""

    name: str
    key_id: str
    digest: bytes
    # Server-side tools it may run ({"*"}: every published one); None: the deployment default.
    tools: frozenset[str] | None = None
    algo: str = "sha256"
    n: int = 0
    r: int = 0
    p: int = 0
    salt: bytes = b""
    # Caps on each engine (`api.engine.Caps`; 0: none); None: the deployment default.
    sessions: int | None = None
    tool_calls: int | None = None

    def matches(self, secret: str) -> bool:
        if self.algo == "scrypt":
            got = hashlib.scrypt(
                secret.encode(),
                salt=self.salt,
                n=self.n,
                r=self.r,
                p=self.p,
                dklen=len(self.digest),
            )
        else:
            got = hashlib.sha256(secret.encode()).digest()
        return hmac.compare_digest(got, self.digest)

    def line(self) -> str:
        b64 = base64.b64encode
        if self.algo == "scrypt":
            hashed = f"scrypt${self.n}${self.r}${self.p}${b64(self.salt).decode()}"
            hashed += f"${b64(self.digest).decode()}"
        else:
            hashed = f"sha256${b64(self.digest).decode()}"
        options = "" if self.tools is None else ":tools=" + ",".join(sorted(self.tools))
        for option, cap in (("sessions", self.sessions), ("tool_calls", self.tool_calls)):
            options += "" if cap is None else f":{option}={cap}"
        return f"{self.name}:{self.key_id}:{hashed}{options}"

    @classmethod
    def parse(cls, line: str, where: str) -> StoredKey:
        try:
            name, key_id, rest = line.split(":", 2)
            # Digests are base64 (no ':'), so every ':' after them starts an option.
            hashed, *options = rest.split(":")
            limits = _options(options)
            algo, *fields = hashed.split("$")
            if not name or len(key_id) != 8:
                raise ValueError
            b64 = base64.b64decode
            if algo == "sha256" and len(fields) == 1:
                return cls(name, key_id, b64(fields[0], validate=True), **limits)
            if algo == "scrypt" and len(fields) == 5:
                n, r, p, salt, digest = fields
                decoded = b64(digest, validate=True)
                return cls(
                    name,
                    key_id,
                    decoded,
                    algo=algo,
                    n=int(n),
                    r=int(r),
                    p=int(p),
                    salt=b64(salt),
                    **limits,
                )
            raise ValueError
        except ValueError as exc:
            raise KeyFileError(
                f"{where}: expected 'name:id:sha256$digest[:tools=a,b][:sessions=N]"
                f"[:tool_calls=N]' (see `interlude keys create`){_why(exc)}"
            ) from None


def _options(options: list[str]) -> dict[str, Any]:
    """A key line's options as StoredKey fields; ValueError naming a bad or repeated one."""
    fields: dict[str, Any] = {}
    for option in options:
        name, has_value, value = option.partition("=")
        if not has_value or name not in ("tools", "sessions", "tool_calls") or name in fields:
            raise ValueError(f"unknown or repeated option {option!r}")
        fields[name] = parse_tools(value) if name == "tools" else parse_cap(name, value)
    return fields


def _why(exc: ValueError) -> str:
    return f": {exc}" if str(exc) else ""


def parse_cap(name: str, value: str) -> int:
    """A cap's count (0: no cap); ValueError for anything but a non-negative integer."""
    if not value.isdigit():
        raise ValueError(f"{name} must be a count >= 0 (0: no cap), got {value!r}")
    return int(value)


ALL_TOOLS = "*"


def parse_tools(named: str) -> frozenset[str]:
    """A tools list (`a,b`; `*`: every published tool, kept as {"*"}; empty: none); ValueError
    for a name no tool can have."""
    if named.strip() == ALL_TOOLS:
        return frozenset({ALL_TOOLS})
    tools = tool_list(named)
    if bad := [t for t in tools if not TOOL_NAME.fullmatch(t)]:
        raise ValueError(f"not tool names: {bad}")
    return tools


def create_key(
    name: str,
    tools: frozenset[str] | None = None,
    sessions: int | None = None,
    tool_calls: int | None = None,
) -> tuple[str, str]:
    """A new key for `name` (that may run `tools` server-side, with at most `sessions` live
    sessions and `tool_calls` server-side calls in flight on each engine, 0 no cap; None: the
    deployment's default): (the key to hand out, the line to append to a keys file)."""
    if not name or ":" in name or any(c.isspace() for c in name):
        raise ValueError(f"a key's name must be non-empty, without ':' or spaces: {name!r}")
    for cap_name, cap in (("sessions", sessions), ("tool_calls", tool_calls)):
        if cap is not None and cap < 0:
            raise ValueError(f"{cap_name} must be >= 0 (0: no cap), got {cap}")
    key_id, secret = secrets.token_hex(4), secrets.token_urlsafe(SECRET_BYTES)
    digest = hashlib.sha256(secret.encode()).digest()
    stored = StoredKey(name, key_id, digest, tools, sessions=sessions, tool_calls=tool_calls)
    return f"{PREFIX}-{key_id}-{secret}", stored.line()


class KeyStore:
    """The keys of one keys file.

    Side effects: reads the file (again when its modification time changes, at most every
    `recheck_s`). Invariant: `verify` returns a name only for a key whose secret hashes to a
    stored digest; a revoked key stops working within `recheck_s`.
    """

    def __init__(self, path: str | Path, recheck_s: float = 5.0) -> None:
        self.path = Path(path)
        self.recheck_s = recheck_s
        self._keys: dict[str, StoredKey] = {}
        self._known: set[bytes] = set()  # verified scrypt keys, by the key's SHA-256
        self._mtime = -1.0
        self._bad_mtime = -1.0  # a changed file that failed to load (its error is logged)
        self._checked = 0.0
        self._load()

    def __len__(self) -> int:
        return len(self._keys)

    def slow(self, presented: str) -> bool:
        """Whether checking `presented` costs a scrypt (an old-form entry not yet verified):
        then run `verify` off the event loop."""
        stored = self._keys.get(_split(presented)[0])
        if stored is None or stored.algo != "scrypt":
            return False
        return hashlib.sha256(presented.encode()).digest() not in self._known

    def verify(self, presented: str) -> str | None:
        """The key's name if `presented` is a valid key, else None."""
        stored = self.verify_key(presented)
        return stored.name if stored is not None else None

    def verify_key(self, presented: str) -> StoredKey | None:
        """The key's entry if `presented` is a valid key, else None."""
        now = time.monotonic()
        if now - self._checked >= self.recheck_s:
            self._checked = now
            self._reload()
        key_id, secret = _split(presented)
        stored = self._keys.get(key_id)
        if stored is None:
            hmac.compare_digest(hashlib.sha256(secret.encode()).digest(), _DUMMY)
            return None
        if stored.algo == "scrypt":
            fast = hashlib.sha256(presented.encode()).digest()
            if fast in self._known:
                return stored
            if not stored.matches(secret):
                return None
            self._known.add(fast)
            return stored
        return stored if stored.matches(secret) else None

    def _reload(self) -> None:
        """Read the file again if it changed. A file that cannot be read or parsed (an edit
        half-done, a typo) keeps the last good keys in use, logged once per change, rather
        than failing every request until it is fixed."""
        try:
            mtime = self.path.stat().st_mtime
        except OSError as exc:
            mtime = -2.0  # gone: not the loaded file's time, and logged once
            problem: str | None = f"cannot read the API keys file {self.path}: {exc}"
        else:
            problem = None
        if mtime == self._mtime or mtime == self._bad_mtime:
            return
        if problem is None:
            try:
                self._load()
                return
            except KeyFileError as exc:
                problem = str(exc)
        self._bad_mtime = mtime
        log.error("%s; the %d keys read before stay in use until it is fixed", problem, len(self))

    def _load(self) -> None:
        try:
            mtime = self.path.stat().st_mtime
            text = self.path.read_text()
        except OSError as exc:
            raise KeyFileError(f"cannot read the API keys file {self.path}: {exc}") from None
        keys: dict[str, StoredKey] = {}
        for i, raw in enumerate(text.splitlines(), 1):
            line = raw.split("#", 1)[0].strip()
            if line:
                entry = StoredKey.parse(line, f"{self.path}:{i}")
                if entry.key_id in keys:
                    # Two keys, one id: the second would silently replace the first.
                    raise KeyFileError(f"{self.path}:{i}: key id {entry.key_id} appears twice")
                keys[entry.key_id] = entry
        if old := sum(k.algo == "scrypt" for k in keys.values()):
            log.warning(
                "%s: %d key(s) stored as scrypt; re-create them with `interlude keys create` "
                "(a wrong secret for one costs the gateway a scrypt)",
                self.path,
                old,
            )
        self._keys, self._known, self._mtime = keys, set(), mtime


def _split(presented: str) -> tuple[str, str]:
    """(id, secret) of a presented key; ("", "") if it is not of our form."""
    parts = presented.split("-", 2)
    if len(parts) != 3 or parts[0] != PREFIX:
        return "", ""
    return parts[1], parts[2]
