"""QueuedView: the snapshot at queue entry, with phase and queue time read live (no engine)."""

from __future__ import annotations

import dataclasses

from vllm import SamplingParams
from vllm.v1.request import Request, RequestStatus

from interlude.enginecore.views import QueuedView, RequestMeta, view_of
from interlude.policy import Phase


def test_queued_view_reads_the_snapshot_except_phase_and_queue_time() -> None:
    meta = RequestMeta(kind="qa", arrival=1.0, tool="calculator", calls_done=2)
    params = SamplingParams(max_tokens=4, extra_args=meta.to_extra_args())
    r = Request("r", [1, 2, 3], params, None)
    snap = view_of(r, None, 0, 32, q_time=5.0, q_iter=7)
    entered: dict[str, tuple[float, int]] = {}
    view = QueuedView(snap, r, entered)
    for field in dataclasses.fields(snap):
        assert getattr(view, field.name) == getattr(snap, field.name), field.name
    assert (view.kind, view.tool, view.calls_done) == ("qa", "calculator", 2)
    # Later: it entered a queue again, then ran; the view says so, the snapshot does not.
    entered["r"] = (9.0, 8)
    r.status = RequestStatus.RUNNING
    assert view.queue_time == 9.0 and view.phase is Phase.RUNNING
    assert snap.queue_time == 5.0 and snap.phase is Phase.WAITING
    r.status = RequestStatus.WAITING_FOR_STREAMING_REQ
    assert view.phase is Phase.PAUSED
