"""API keys: created once, stored only as scrypt hashes, checked in constant time.

A key reads ``il-<id>-<secret>``: the id (8 hex digits) finds the stored entry without trying
every hash, and only the secret is hashed. A keys file has one entry per line,
``<name>:<id>:scrypt$<n>$<r>$<p>$<salt b64>$<hash b64>`` (``#`` starts a comment), so the file
can be read by anyone who may see it without giving a key away.

scrypt costs tens of milliseconds on purpose; a key that verified once is remembered by its
SHA-256 (a fast hash is safe there: the secret holds 192 random bits) so a request pays a dict
lookup, not a scrypt. The file is re-read when it changes, so keys rotate without a restart.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

PREFIX = "il"
_N, _R, _P = 2**14, 8, 1  # scrypt's interactive-login parameters (RFC 7914, section 2)


class KeyFileError(ValueError):
    """The keys file is malformed; the message names the line."""


@dataclass(frozen=True)
class StoredKey:
    """One keys-file entry: who it is for, the key's id and its scrypt hash."""

    name: str
    key_id: str
    n: int
    r: int
    p: int
    salt: bytes
    digest: bytes

    def matches(self, secret: str) -> bool:
        got = hashlib.scrypt(
            secret.encode(), salt=self.salt, n=self.n, r=self.r, p=self.p, dklen=len(self.digest)
        )
        return hmac.compare_digest(got, self.digest)

    def line(self) -> str:
        b64 = base64.b64encode
        hashed = f"scrypt${self.n}${self.r}${self.p}${b64(self.salt).decode()}"
        return f"{self.name}:{self.key_id}:{hashed}${b64(self.digest).decode()}"

    @classmethod
    def parse(cls, line: str, where: str) -> StoredKey:
        try:
            name, key_id, hashed = line.split(":", 2)
            algo, n, r, p, salt, digest = hashed.split("$")
            if algo != "scrypt" or not name or len(key_id) != 8:
                raise ValueError
            return cls(
                name,
                key_id,
                int(n),
                int(r),
                int(p),
                base64.b64decode(salt, validate=True),
                base64.b64decode(digest, validate=True),
            )
        except ValueError:
            raise KeyFileError(
                f"{where}: expected 'name:id:scrypt$n$r$p$salt$hash' (see `interlude keys create`)"
            ) from None


def create_key(name: str) -> tuple[str, str]:
    """A new key for `name`: (the key to hand out, the line to append to a keys file)."""
    if not name or ":" in name or any(c.isspace() for c in name):
        raise ValueError(f"a key's name must be non-empty, without ':' or spaces: {name!r}")
    key_id, secret = secrets.token_hex(4), secrets.token_urlsafe(24)
    salt = os.urandom(16)
    digest = hashlib.scrypt(secret.encode(), salt=salt, n=_N, r=_R, p=_P, dklen=32)
    return f"{PREFIX}-{key_id}-{secret}", StoredKey(name, key_id, _N, _R, _P, salt, digest).line()


class KeyStore:
    """The keys of one keys file.

    Side effects: reads the file (again when its modification time changes, at most every
    `recheck_s`). Invariant: `verify` returns a name only for a key whose secret hashes to a
    stored digest; remembered keys are dropped when the file changes (a revoked key stops
    working within `recheck_s`).
    """

    def __init__(self, path: str | Path, recheck_s: float = 5.0) -> None:
        self.path = Path(path)
        self.recheck_s = recheck_s
        self._keys: dict[str, StoredKey] = {}
        self._known: dict[bytes, str] = {}
        self._mtime = -1.0
        self._checked = 0.0
        self._load()

    def __len__(self) -> int:
        return len(self._keys)

    def verify(self, presented: str) -> str | None:
        """The key's name if `presented` is a valid key, else None."""
        now = time.monotonic()
        if now - self._checked >= self.recheck_s:
            self._checked = now
            if self.path.stat().st_mtime != self._mtime:
                self._load()
        fast = hashlib.sha256(presented.encode()).digest()
        if (name := self._known.get(fast)) is not None:
            return name
        parts = presented.split("-", 2)
        if len(parts) != 3 or parts[0] != PREFIX:
            return None
        stored = self._keys.get(parts[1])
        if stored is None or not stored.matches(parts[2]):
            return None
        self._known[fast] = stored.name
        return stored.name

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
                keys[entry.key_id] = entry
        self._keys, self._known, self._mtime = keys, {}, mtime
