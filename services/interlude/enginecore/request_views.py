"""The policy's views of an engine's requests, and the records they are built from.

vLLM's `Request` does not say when a request entered its current queue, whether the scheduler
ever ran it (a resumed turn whose KV was discarded restarts from token 0 and looks new), or the
session's kind and tool (`RequestMeta`, read once from its sampling parameters). `RequestViews`
keeps those per request and builds `EngineRequestView`s from them (`views.view_of`). Views of
parked and queued requests are cached under a stamp of what can change while they wait: the
policy sees all of them at every step, and they rarely change.
"""

from __future__ import annotations

from vllm.v1.request import Request, RequestStatus

from interlude.enginecore.parking import Parked, ParkingLot
from interlude.enginecore.swap import HostSwapConnector
from interlude.enginecore.views import EngineRequestView, MetaCache, view_of

PARKED = RequestStatus.WAITING_FOR_STREAMING_REQ


class RequestViews:
    """Views of one scheduler's requests.

    Side effects: only on its own records. The scheduler writes `entered` when a request
    enters a queue or is scheduled and `ran` when it is scheduled, and calls `forget` when it
    frees one; nothing here changes a request.
    """

    def __init__(self, swap: HostSwapConnector | None, lot: ParkingLot, block_size: int) -> None:
        self.swap = swap
        self.lot = lot
        self.block_size = block_size
        self.entered: dict[str, tuple[float, int]] = {}  # request id -> (queue time, iteration)
        # Requests scheduled at least once (`RequestView.scheduled_once`): a session back from
        # a call whose KV was discarded shows no computed tokens and no outputs, and without
        # this the starvation guard, which counts only requests that ran, would never count
        # its wait (the simulator's would).
        self.ran: set[str] = set()
        self.metas = MetaCache()
        self._cache: dict[str, tuple[tuple[object, ...], EngineRequestView]] = {}

    def view(self, r: Request, now: float, iteration: int) -> EngineRequestView:
        """`r` as the policy sees it now (never cached)."""
        q_time, q_iter = self.entered.get(r.request_id, (now, iteration))
        host = self.swap.host_tokens(r.request_id) if self.swap else 0
        # A copy still coming back is on the host, for the policy as for the simulator,
        # although vLLM counts it computed from its allocation on.
        loading = self.swap.loading_tokens(r.request_id) if self.swap else 0
        p = self.lot.parked.get(r.request_id)
        ran = r.request_id in self.ran
        meta = self.metas.get(r)
        return view_of(r, p, host, self.block_size, q_time, q_iter, meta, ran, loading)

    def paused(self, p: Parked, r: Request, now: float, iteration: int) -> EngineRequestView:
        """Parked request `r` (`p`): while parked only its blocks move (swap, discard); its
        tokens wait for the tool."""
        stamp = (PARKED, p.saved_blocks, p.on_gpu, self.entered.get(p.request_id))
        return self._cached(r, stamp, now, iteration)

    def queued(self, r: Request, now: float, iteration: int) -> EngineRequestView:
        """Queued request `r`: it changes when it re-enters, is partly prefilled, or its host
        copy changes; everything else in its view was fixed when it entered."""
        host = self.swap.host_tokens(r.request_id) if self.swap else 0
        entered = self.entered.get(r.request_id)
        stamp = (r.status, r.num_computed_tokens, r.num_tokens, host, entered)
        return self._cached(r, stamp, now, iteration)

    def forget(self, request_id: str) -> None:
        """Drop every record of a freed request."""
        self.entered.pop(request_id, None)
        self.ran.discard(request_id)
        self._cache.pop(request_id, None)
        self.metas.forget(request_id)

    def _cached(
        self, r: Request, stamp: tuple[object, ...], now: float, iteration: int
    ) -> EngineRequestView:
        hit = self._cache.get(r.request_id)
        if hit is not None and hit[0] == stamp:
            return hit[1]
        view = self.view(r, now, iteration)
        self._cache[r.request_id] = (stamp, view)
        return view
