"""The kopf handlers: start-up, log-in, clean-up, one timer per EnginePool, its deletion.

The timer ticks every `TICK_S`; a pass runs when the pool's `metrics.intervalSeconds` has gone
by since the last (`reconcile.reconcile`). What kopf cannot retry usefully (a bad spec, a
Deployment owned by something else, a denied write) is a `kopf.PermanentError`, raised once
per distinct cause so the log and the events do not repeat it every tick; what may pass (the
API server away, throttling) is a `kopf.TemporaryError`, retried after `RETRY_S`. A conflict
(a conditional write found the object changed since it was read) is one too, retried on the
next tick with a whole pass on a fresh read.

A pool whose spec asks for more than the allow-list of `podsecurity` gives its engine pods, or
whose rendered pod would break the restricted Pod Security Standard, is refused that way.

Peering (kopf's, see `__main__`) keeps every replica but one paused: kopf stops this module's
timers in a paused replica, so only the active one ever runs a pass.
"""

from __future__ import annotations

import logging
from typing import Any

import kopf

from interlude_operator import GROUP, PLURAL, VERSION, telemetry
from interlude_operator.deployment import pod_template
from interlude_operator.kube import ApiError, Kube, login, pool_path, version_of
from interlude_operator.observed import OwnershipError
from interlude_operator.pods import now_utc
from interlude_operator.podsecurity import require_restricted
from interlude_operator.reconcile import PoolState, reconcile
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
    # Peering (standalone or not, its object's name, this replica's priority) is the command
    # line's: kopf.run sets it before this runs, and it is left as set.
    logging.getLogger("kopf.objects").addFilter(_QuietTimer())
    memo.kube = Kube()
    memo.pools = {}


@kopf.on.login()
def authenticate(settings: kopf.OperatorSettings, **_: Any) -> kopf.ConnectionInfo:
    return login(settings)


@kopf.on.cleanup()
async def close(memo: kopf.Memo, **_: Any) -> None:
    for state in memo.pools.values():
        await state.close()
    await memo.kube.close()


@kopf.on.event(GROUP, VERSION, PLURAL)
async def forget(
    event: kopf.RawEvent, namespace: str | None, name: str, memo: kopf.Memo, **_: Any
) -> None:
    # The Deployment goes with the pool (its owner reference); only the memory is ours. A
    # watch handler, not kopf.on.delete: change handlers make kopf annotate the pool after
    # every spec change (its diff base), a write racing each pass's conditional ones.
    if event.get("type") != "DELETED":
        return
    state = memo.pools.pop((namespace, name), None)
    telemetry.forget(namespace or "", name)
    if state is not None:
        await state.close()


# The first tick waits one: kopf starts the timer as it adds its finalizer, and a pass begun
# on the body from before that write would find its conditional writes refused.
@kopf.timer(GROUP, VERSION, PLURAL, interval=TICK_S, initial_delay=TICK_S, id="reconcile")
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
        # The rendered pod, checked as an admission with the restricted profile would.
        require_restricted(pod_template(name, pool)["spec"])
    except ValueError as exc:
        await _refuse(memo.kube, body, state, "InvalidSpec", f"invalid spec: {exc}")
        return
    try:
        await reconcile(body, pool, memo.kube, state, post)
    except OwnershipError as exc:
        await _refuse(memo.kube, body, state, "DeploymentNotOwned", str(exc))
    except ApiError as exc:
        if exc.conflict:
            state.last_pass = -1e18  # the retry is a whole pass on a fresh read
            raise _changed(exc) from exc
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
    path = pool_path(body.meta["namespace"], body.meta["name"], "status")
    try:
        await kube.patch(path, {"status": status}, version_of(body))
    except ApiError as exc:
        # A failed status write changes nothing, the event and the error below say it all the
        # same; but after a conflict the pool has changed: judge its new version instead.
        if exc.conflict:
            state.last_code = ""
            raise _changed(exc) from exc
    kopf.event(body, type="Warning", reason=reason, message=message)
    telemetry.record_event(body.meta["namespace"], body.meta["name"], "Warning", reason)
    raise kopf.PermanentError(message)


def _changed(exc: ApiError) -> kopf.TemporaryError:
    """A conditional write found its object changed since it was read: retry on a fresh one."""
    return kopf.TemporaryError(f"changed since read, retrying: {exc}", delay=TICK_S)
