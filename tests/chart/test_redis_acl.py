"""The chart's Valkey ACL users: the rules are `interlude.bus.acl`'s, the passwords the Secret's.

The committed rules file is what `python -m interlude.bus.acl` prints; the ACL file the chart
renders into the Secret is exactly `acl.acl_file()` of the Secret's own passwords; a real Valkey
loads it, and each component's URL (user and Secret key) opens its user there and no other.
"""

from __future__ import annotations

import base64
import re
from pathlib import Path
from typing import Any

import pytest
from redis import Redis
from redis.exceptions import AuthenticationError, NoPermissionError

from interlude.bus import acl

from .conftest import CASES, CHART, Manifest, by_kind, container, env_of, name

RULES = CHART / "files" / "valkey-users.acl"
COMPONENTS = ("engine", "gateway", "tools")


def _secret(docs: tuple[Manifest, ...]) -> dict[str, str]:
    data = by_kind(docs, "Secret")[name("redis")]["data"]
    return {key: base64.b64decode(value).decode() for key, value in data.items()}


def test_committed_rules_are_the_generated_ones() -> None:
    assert RULES.read_text() == acl.template(), (
        "run: .venv/bin/python -m interlude.bus.acl > charts/interlude/files/valkey-users.acl"
    )


def test_the_rendered_acl_file_is_the_rules_with_the_secrets_passwords(render: Any) -> None:
    for case, ha in (("default", False), ("production-gpu", True), ("everything", False)):
        data = _secret(render(*CASES[case]))
        users = acl.users(ha)
        keys = {u: "password" if u == acl.ADMIN else f"{u}-password" for u in users}
        passwords = {u: data[key] for u, key in keys.items()}
        assert set(data) == {*keys.values(), "users.acl"}
        assert set(users) >= {acl.ADMIN, *COMPONENTS}
        assert len(set(passwords.values())) == len(users) and all(
            re.fullmatch(r"[A-Za-z0-9]{32}", p) for p in passwords.values()
        )  # random, distinct, URL-safe
        assert data["users.acl"] == acl.acl_file(passwords, ha)
        assert not any(p in data["users.acl"] for p in passwords.values())  # hashes only


def test_valkey_reads_the_acl_file_from_the_secret(render: Any) -> None:
    docs = render()
    valkey = by_kind(docs, "StatefulSet")[name("redis")]
    pod = valkey["spec"]["template"]
    (c,) = pod["spec"]["containers"]
    assert c["command"] == ["valkey-server", "/etc/valkey/valkey.conf"]  # no --requirepass
    config = by_kind(docs, "ConfigMap")[name("redis")]["data"]["valkey.conf"]
    assert "aclfile /etc/valkey-acl/users.acl" in config.splitlines()
    assert {"name": "acl", "mountPath": "/etc/valkey-acl", "readOnly": True} in c["volumeMounts"]
    volume = next(v for v in pod["spec"]["volumes"] if v["name"] == "acl")
    assert volume["secret"]["secretName"] == name("redis")
    assert volume["secret"]["items"] == [{"key": "users.acl", "path": "users.acl"}]
    # The readiness probe's valkey-cli logs in as the admin (`default`).
    assert env_of(c)["REDIS_PASSWORD"]["secretKeyRef"] == {"name": name("redis"), "key": "password"}
    assert "checksum/acl" in pod["metadata"]["annotations"]


def test_each_component_logs_in_as_its_own_user_on_a_real_valkey(
    render: Any, tmp_path: Path
) -> None:
    from interlude.stack.valkey import Valkey

    docs = render(*CASES["everything"])  # the engines' env from the EnginePool, for the operator
    data = _secret(docs)
    (tmp_path / "users.acl").write_text(data["users.acl"])

    class Loaded(Valkey):
        def argv(self) -> list[str]:
            return [*super().argv(), "--aclfile", str(tmp_path / "users.acl")]

        @property
        def url(self) -> str:  # `start` pings as the admin
            return f"redis://default:{data['password']}@127.0.0.1:{self.port}/0"

    server = Loaded(tmp_path)
    server.start()
    (pool,) = by_kind(docs, "EnginePool").values()
    envs = {c: env_of(container(docs, c)) for c in ("gateway", "tools")}
    envs["engine"] = env_of(pool["spec"]["engine"])
    try:
        with Redis.from_url(server.url, decode_responses=True) as admin:
            for component, env in envs.items():
                key = env["INTERLUDE_REDIS_PASSWORD"]["secretKeyRef"]["key"]
                url = env["INTERLUDE_REDIS_URL"].replace("$(INTERLUDE_REDIS_PASSWORD)", data[key])
                url = url.replace(f"{name('redis')}:6379", f"127.0.0.1:{server.port}")
                with Redis.from_url(url) as client:
                    client.execute_command("CLIENT", "SETINFO", "LIB-NAME", f"as-{component}")
                    with pytest.raises(NoPermissionError):
                        client.flushall()
                    clients = admin.client_list()
                (seen,) = [c for c in clients if c["lib-name"] == f"as-{component}"]
                assert seen["user"] == component
                other = "tools" if component != "tools" else "engine"  # its password, not theirs
                with (
                    pytest.raises(AuthenticationError),
                    Redis.from_url(url.replace(f"//{component}:", f"//{other}:")) as client,
                ):
                    client.ping()
    finally:
        server.stop()


def test_an_existing_secret_holds_every_password_and_the_acl_file(render: Any) -> None:
    docs = render("--set", "redis.existingSecret=mine,redis.existingSecretKey=admin")
    assert name("redis") not in by_kind(docs, "Secret")
    for component in COMPONENTS:
        ref = env_of(container(docs, component))["INTERLUDE_REDIS_PASSWORD"]["secretKeyRef"]
        assert ref == {"name": "mine", "key": f"{component}-password"}
    valkey = by_kind(docs, "StatefulSet")[name("redis")]["spec"]["template"]["spec"]
    volume = next(v for v in valkey["volumes"] if v["name"] == "acl")
    assert volume["secret"]["secretName"] == "mine"
    probe = env_of(valkey["containers"][0])["REDIS_PASSWORD"]["secretKeyRef"]
    assert probe == {"name": "mine", "key": "admin"}
