"""The kopf handlers: start-up, log-in, clean-up and one timer per EnginePool.

The timer ticks every `TICK_S`; a pass runs when the pool's `metrics.intervalSeconds` has gone
by since the last (`reconcile.reconcile`). What kopf cannot retry usefully (a bad spec, a
Deployment owned by something else, a denied write) is a `kopf.PermanentError`, raised once
per distinct cause so the log and the events do not repeat it every tick; what may pass (the
API server away, a conflict) is a `kopf.TemporaryError`, retried after `RETRY_S`.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import kopf

from interlude_operator import GROUP, PLURAL, VERSION, telemetry
from interlude_operator.kube import ApiError, Kube, login, pool_path
from interlude_operator.pods import now_utc
from interlude_operator.reconcile import OwnershipError, PoolState, reconcile
from interlude_operator.spec import parse
from interlude_operator.status import Condition, conditions

TICK_S = 1.0
RETRY_S = 5.0
FINALIZER = "interlude.dev/operator"


class _QuietTimer(logging.Filter):
    """Drops kopf's 'Timer ... succeeded.' line, which would otherwise come every tick."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "succeeded" not in record.getMessage() or "reconcile" not in record.getMessage()


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    # Decisions are posted as events explicitly (kopf.event); log lines become events only
    # from warnings up, or every tick's success line would be one.
    settings.posting.level = logging.WARNING
    settings.persistence.finalizer = FINALIZER
    # One operator replica (the chart's Deployment): no peering objects to coordinate with.
    settings.peering.standalone = True
    logging.getLogger("kopf.objects").addFilter(_QuietTimer())
    memo.kube = Kube()
    memo.pools = {}


@kopf.on.login()
def authenticate(settings: kopf.OperatorSettings, **_: Any) -> kopf.ConnectionInfo:
    return login(settings)


@kopf.on.cleanup()
async def close(memo: kopf.Memo, **_: Any) -> None:
    for state in memo.pools.values():
        if state.source is not None:
            await state.source.close()
    await memo.kube.close()


@kopf.on.delete(GROUP, VERSION, PLURAL, optional=True)
async def forget(namespace: str | None, name: str, memo: kopf.Memo, **_: Any) -> None:
    # The Deployment goes with the pool (its owner reference); only the memory is ours.
    state = memo.pools.pop((namespace, name), None)
    telemetry.forget(namespace or "", name)
    if state is not None and state.source is not None:
        await state.source.close()


@kopf.timer(GROUP, VERSION, PLURAL, interval=TICK_S, id="reconcile")
async def tick(
    body: kopf.Body,
    spec: kopf.Spec,
    namespace: str | None,
    name: str,
    memo: kopf.Memo,
    **_: Any,
) -> None:
    state: PoolState = memo.pools.setdefault((namespace, name), PoolState())

    def post(kind: str, reason: str, message: str) -> None:
        kopf.event(body, type=kind, reason=reason, message=message)
        telemetry.record_event(namespace or "", name, kind, reason)

    try:
        pool = parse(dict(spec))
    except ValueError as exc:
        await _refuse(memo.kube, body, state, "InvalidSpec", f"invalid spec: {exc}")
        return
    try:
        await reconcile(body, pool, memo.kube, state, post)
    except OwnershipError as exc:
        await _refuse(memo.kube, body, state, "DeploymentNotOwned", str(exc))
    except ApiError as exc:
        if exc.transient:
            raise kopf.TemporaryError(f"Kubernetes API: {exc}", delay=RETRY_S) from exc
        await _refuse(memo.kube, body, state, "ApiRefused", f"Kubernetes API refused: {exc}")
    else:
        if state.last_code.startswith("refused:"):
            state.last_code = ""


async def _refuse(kube: Kube, body: kopf.Body, state: PoolState, reason: str, message: str) -> None:
    """Say once why the pool cannot be reconciled: a Ready=False condition, a Warning event
    and a permanent error; later ticks stay quiet until the cause changes."""
    code = f"refused:{reason}:{message}"
    if state.last_code == code:
        return
    state.last_code = code
    state.last_pass = -1e18  # once fixed, the next tick runs a pass at once
    old = list(body.status.get("conditions") or [])
    ready = conditions([Condition("Ready", False, reason, message)], old, now_utc(), None)
    status = {"conditions": [c for c in old if c.get("type") != "Ready"] + ready}
    # A failed status write changes nothing: the event and the error below say it all the same.
    with contextlib.suppress(ApiError):
        await kube.patch(
            pool_path(body.meta["namespace"], body.meta["name"], "status"), {"status": status}
        )
    kopf.event(body, type="Warning", reason=reason, message=message)
    telemetry.record_event(body.meta["namespace"], body.meta["name"], "Warning", reason)
    raise kopf.PermanentError(message)
