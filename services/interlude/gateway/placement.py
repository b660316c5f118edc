"""Where one request goes: the choice the gateway (`relay`) and the endpoint picker
(`interlude.picker`) share, so that both paths into the engines route alike.

A continuation (its tool results name an engine: `Hint.tag`) goes to the engine holding its
paused session, draining or not. Anything else, or a continuation whose engine is gone (it is
recomputed), goes to the better of two random candidates (`EngineRoster.choose`: KV usage,
contended waste and queue depth; draining and prefill engines only when nothing else is left).
With `shed_queue`, a new session is refused (`Shed`, a 429) when every candidate already has
that many requests waiting per slot: it would wait behind them longer than a client's retry
takes. Continuations are never shed: their KV is parked on their engine, and refusing them
wastes it. A session placed anew on a decode engine has its prompt prefilled on a prefill
engine (`EngineRoster.choose_prefill`).
"""

from __future__ import annotations

from dataclasses import dataclass

from interlude.gateway.hint import Hint
from interlude.gateway.roster import EngineRoster, EngineState, NoEngine


class Shed(LookupError):
    """Every engine that could take a new session is over the queue limit (HTTP 429)."""

    def __init__(self, message: str, retry_after_s: int = 1) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


@dataclass(frozen=True)
class Placement:
    """The engine for one request, and how it was chosen."""

    engine: EngineState
    placed: bool  # False: the engine holding the paused session this request continues
    # What happened, for metrics: "affinity" or "affinity_lost", "balanced", "prefill".
    routes: tuple[str, ...]
    prefill: EngineState | None = None  # where its prompt is prefilled, for a decode engine


def place(
    pool: EngineRoster,
    hint: Hint,
    avoid: frozenset[str] = frozenset(),
    within: frozenset[str] | None = None,
    shed_queue: float = 0.0,
    prompt_tokens: int = 0,
) -> Placement:
    """The engine for a request: NoEngine when no ready engine in `within` (None: any) serves
    its model, Shed when `shed_queue` > 0 and every candidate for a new session has that many
    requests waiting per slot. `avoid`: engines this request could not reach."""
    lost: tuple[str, ...] = ()
    if hint.tag is not None:
        engine = pool.by_tag(hint.tag, hint.model)
        if (
            engine is not None
            and engine.url not in avoid
            and (within is None or engine.url in within)
        ):
            return Placement(engine, False, ("affinity",))
        lost = ("affinity_lost",)
    serving = pool.candidates(hint.model, avoid, within)
    if shed_queue > 0 and all(e.queue_share() >= shed_queue for e in serving):
        raise Shed(
            f"every engine serving {hint.model!r} has {shed_queue:g} or more requests waiting "
            "per slot: retry later"
        )
    engine = pool.pick(serving)
    prefill = pool.choose_prefill(engine, prompt_tokens)
    routes = (*lost, "balanced", *(("prefill",) if prefill is not None else ()))
    return Placement(engine, True, routes, prefill)


def fallbacks(
    pool: EngineRoster, first: EngineState, model: str, n: int, within: frozenset[str] | None = None
) -> list[EngineState]:
    """Up to `n` engines to try after `first` if it cannot be reached, best score first:
    among the candidates for a new session (a continuation sent there is recomputed)."""
    try:
        others = [e for e in pool.candidates(model, within=within) if e is not first]
    except NoEngine:
        return []
    return sorted(others, key=EngineState.score)[:n]
