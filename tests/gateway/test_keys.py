"""API keys at the gateway: digests, rotation and revocation, old scrypt lines, the tools and
caps a key carries, failed attempts per address, and a keys file that is malformed or edited
badly."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from interlude.gateway.auth import KeyFileError, KeyStore, create_key


def test_api_keys_verify_by_hash_and_rotate(tmp_path: Path) -> None:
    key, line = create_key("alice")
    other, _ = create_key("bob")
    assert key not in line  # only the hash is stored
    path = tmp_path / "keys"
    path.write_text("# team keys\n" + line + "\n")
    store = KeyStore(path, recheck_s=0.0)
    assert store.verify(key) == "alice"
    assert store.verify(key) == "alice"  # the remembered path
    assert store.verify(other) is None
    assert store.verify(key[:-1] + ("A" if key[-1] != "A" else "B")) is None
    assert store.verify("not-a-key") is None
    time.sleep(0.01)
    path.write_text("")  # revoked
    os.utime(path, (time.time() + 5, time.time() + 5))
    assert store.verify(key) is None


def test_keys_are_sha256_digests_and_old_scrypt_lines_still_verify(tmp_path: Path) -> None:
    import base64
    import hashlib

    from interlude.gateway.auth import StoredKey

    key, line = create_key("alice")
    secret = key.split("-", 2)[2]
    assert len(base64.urlsafe_b64decode(secret + "=" * (-len(secret) % 4))) * 8 >= 192
    assert line.split(":", 2)[2].startswith("sha256$")
    salt = b"0123456789abcdef"
    digest = hashlib.scrypt(b"s3cret", salt=salt, n=2**4, r=8, p=1, dklen=32)
    old = StoredKey("bob", "0badf00d", digest, algo="scrypt", n=2**4, r=8, p=1, salt=salt)
    path = tmp_path / "keys"
    path.write_text(line + "\n" + old.line() + "\n")
    store = KeyStore(path, recheck_s=0.0)
    assert store.verify(key) == "alice" and not store.slow(key)
    assert store.slow("il-0badf00d-s3cret")  # checked off the event loop, once
    assert store.verify("il-0badf00d-s3cret") == "bob"
    assert not store.slow("il-0badf00d-s3cret")
    assert store.verify("il-0badf00d-wrong") is None


def test_a_caller_leaving_during_a_slow_key_check_still_counts_its_failure(
    tmp_path: Path,
) -> None:
    """The chat route cancels a request whose client left; a wrong secret for an old scrypt
    entry, checked in a thread, must count against its address all the same, or a client
    hanging up after each guess would never be blocked."""
    import hashlib

    from interlude.gateway.auth import StoredKey
    from interlude.gateway.guard import FailedAttempts, Guard

    salt = b"0123456789abcdef"
    digest = hashlib.scrypt(b"s3cret", salt=salt, n=2**4, r=8, p=1, dklen=32)
    old = StoredKey("bob", "0badf00d", digest, algo="scrypt", n=2**4, r=8, p=1, salt=salt)
    (tmp_path / "keys").write_text(old.line() + "\n")
    guard = Guard(KeyStore(tmp_path / "keys", recheck_s=0.0), None, FailedAttempts(limit=1))
    wrong = {"authorization": "Bearer il-0badf00d-wrong"}

    async def scenario() -> float:
        admit = asyncio.ensure_future(guard.admit(wrong, "10.0.0.1"))
        await asyncio.sleep(0)  # its check is in the thread now
        admit.cancel()
        with pytest.raises(asyncio.CancelledError):
            await admit
        await asyncio.sleep(0.5)  # the thread's check ends
        return guard.failures.blocked("10.0.0.1")

    assert asyncio.run(scenario()) > 0


def test_a_key_carries_the_tools_it_may_run(tmp_path: Path) -> None:
    from starlette.requests import Request

    from interlude.gateway.auth import parse_tools
    from interlude.gateway.guard import Caller, Guard

    calc, calc_line = create_key("calc", frozenset({"calculator"}))
    anything, any_line = create_key("any", parse_tools("*"))
    default, default_line = create_key("default")
    assert calc_line.endswith(":tools=calculator") and any_line.endswith(":tools=*")
    path = tmp_path / "keys"
    path.write_text("\n".join((calc_line, any_line, default_line)) + "\n")
    guard = Guard(KeyStore(path), None, default_tools=frozenset())

    def caller(key: str) -> Caller:
        scope = {
            "type": "http",
            "headers": [(b"authorization", f"Bearer {key}".encode())],
            "client": ("10.0.0.1", 1),
        }
        return asyncio.run(guard(Request(scope)))

    assert caller(calc).tools == {"calculator"}
    assert caller(anything).tools is None  # every published tool
    assert caller(default).tools == frozenset()  # the deployment's default: none
    with pytest.raises(ValueError):
        parse_tools("calc ulator")


def test_a_key_carries_its_caps_and_keys_without_take_the_gateways(tmp_path: Path) -> None:
    from starlette.requests import Request

    from interlude.api.engine import CAPS_HEADER, Caps, caps_of
    from interlude.gateway.auth import StoredKey
    from interlude.gateway.guard import Caller, Guard

    capped, capped_line = create_key("capped", frozenset({"calculator"}), 2, 3)
    half, half_line = create_key("half", sessions=0)  # 0: no cap, whatever the default
    default, default_line = create_key("default")
    assert capped_line.endswith(":tools=calculator:sessions=2:tool_calls=3")
    parsed = StoredKey.parse(capped_line, "x:1")
    assert (parsed.tools, parsed.sessions, parsed.tool_calls) == ({"calculator"}, 2, 3)
    assert parsed.line() == capped_line
    # Options in any order; a repeated, unknown or negative one names the line and the option.
    digest = capped_line.split(":")[2]
    assert StoredKey.parse(f"a:0123abcd:{digest}:tool_calls=1:tools=", "x").tool_calls == 1
    for bad in ("sessions=-1", "sessions=x", "seats=1", "sessions=1:sessions=2"):
        with pytest.raises(KeyFileError, match=r"x:7: .*sessions=N.*" + bad.split("=")[0]):
            StoredKey.parse(f"a:0123abcd:{digest}:{bad}", "x:7")
    path = tmp_path / "keys"
    path.write_text("\n".join((capped_line, half_line, default_line)) + "\n")
    guard = Guard(KeyStore(path), None, default_caps=Caps(sessions=5, tool_calls=7))

    def caller(key: str) -> Caller:
        scope = {"type": "http", "headers": [(b"authorization", f"Bearer {key}".encode())]}
        return asyncio.run(guard(Request({**scope, "client": ("10.0.0.1", 1)})))

    assert caller(capped).caps == Caps(2, 3)
    assert caller(half).caps == Caps(0, 7)  # each cap on its own
    assert caller(default).caps == Caps(5, 7)
    # What the engine reads back: only from the gateway (its token), and only the known caps.
    header = {CAPS_HEADER: Caps(2, 3).header(), "x-interlude-gateway-token": "t"}
    assert header[CAPS_HEADER] == "sessions=2,tool_calls=3"
    assert caps_of(header, "t") == Caps(2, 3) and caps_of(header, "other") == Caps()
    assert caps_of({CAPS_HEADER: "sessions=1,newer=9"}, "") == Caps(sessions=1)
    with pytest.raises(ValueError):
        caps_of({CAPS_HEADER: "sessions=lots"}, "")


def test_failed_attempts_block_an_address_for_the_rest_of_the_window() -> None:
    from interlude.gateway.guard import FailedAttempts

    f = FailedAttempts(limit=3, window_s=10.0, max_addresses=2)
    for t in (0.0, 1.0, 2.0):
        assert f.blocked("a", now=t) == 0.0
        f.failed("a", now=t)
    assert f.blocked("a", now=3.0) == 7.0  # until the first failure ages out
    assert f.blocked("a", now=10.5) == 0.0
    f.failed("b", now=11.0)
    f.failed("c", now=11.0)  # over max_addresses: the least recent ("a") is forgotten
    assert "a" not in f._by_address and set(f._by_address) == {"b", "c"}


def test_a_malformed_keys_file_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text("alice:12345678:plain$secret\n")
    with pytest.raises(KeyFileError, match=":1"):
        KeyStore(path)
    with pytest.raises(ValueError):
        create_key("has space")


def test_a_bad_edit_of_the_keys_file_keeps_the_last_good_keys(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    key, line = create_key("alice")
    path = tmp_path / "keys"
    path.write_text(line + "\n")
    store = KeyStore(path, recheck_s=0.0)
    later = time.time() + 5
    for broken in ("alice:12345678:plain$secret\n", None):  # a typo, then the file gone
        if broken is None:
            path.unlink()
        else:
            path.write_text(line + "\n" + broken)
            os.utime(path, (later, later))
        assert store.verify(key) == "alice"  # not a 500 on every request
    assert sum("stay in use" in r.message for r in caplog.records) == 2  # once per change
    path.write_text("")  # fixed: revoked
    os.utime(path, (later + 5, later + 5))
    assert store.verify(key) is None


def test_two_keys_with_one_id_are_refused(tmp_path: Path) -> None:
    _, line = create_key("alice")
    path = tmp_path / "keys"
    path.write_text(line + "\n" + line.replace("alice", "mallory", 1) + "\n")
    with pytest.raises(KeyFileError, match="appears twice"):
        KeyStore(path)
