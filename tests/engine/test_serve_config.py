"""`interlude engine`'s config (engine/serve.py `service_config`): flags win over the
environment, and what is left unset comes from it."""

from __future__ import annotations

from typing import Any

import pytest

from interlude.engine.serve import service_config, stable_engine_id
from interlude.engine.server import ServiceConfig


def config(**flags: Any) -> ServiceConfig:
    base: dict[str, Any] = {
        "model": "/models/some-llama",
        "policy": "interlude",
        "profile": "tiny-llama-cpu",
        "blocks": None,
        "host_blocks": 64,
        "settings": {"max_num_seqs": 8},
        "tool_parser": "hermes",
        "port": 8123,
        "redis_url": None,
        "engine_id": None,
        "client_deadline_s": 30.0,
    }
    return service_config(**(base | flags))


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INTERLUDE_REDIS_URL", "redis://from-env:6379/0")
    monkeypatch.setenv("INTERLUDE_BENCHMARK_MODE", "1")
    monkeypatch.delenv("INTERLUDE_ENGINE_ID", raising=False)


@pytest.mark.usefixtures("env")
def test_flags_win_over_the_environment() -> None:
    cfg = config(redis_url="redis://from-flag:6379/0", engine_id="e7", benchmark_mode=False)
    assert cfg.redis_url == "redis://from-flag:6379/0"
    assert cfg.engine_id == "e7"
    assert cfg.chat.benchmark_mode is False


@pytest.mark.usefixtures("env")
def test_what_the_flags_leave_unset_comes_from_the_environment() -> None:
    cfg = config(policy=None)
    assert cfg.redis_url == "redis://from-env:6379/0"
    assert cfg.chat.benchmark_mode is True
    # No name given anywhere: one that survives a restart, so results that came meanwhile
    # are still read.
    assert cfg.engine_id == stable_engine_id(8123)
    # Stock vLLM's scheduler (no policy) parks nothing: no host pool.
    assert cfg.engine.host_blocks == 0
    assert cfg.engine.max_num_seqs == 8
