"""PolicyQueue: vLLM's waiting queues ordered by the policy's key (no engine started)."""

from __future__ import annotations

import pytest
from vllm import SamplingParams
from vllm.v1.request import Request, RequestStatus

from interlude.enginecore.policy_queue import DORMANT, PolicyQueue


def make_request(rid: str, parked: bool = False) -> Request:
    r = Request(rid, [1, 2, 3], SamplingParams(max_tokens=4), None)
    if parked:
        r.status = RequestStatus.WAITING_FOR_STREAMING_REQ
    return r


class Keys:
    """A key function that records how often it was asked; keys come from a table."""

    def __init__(self, table: dict[str, float]) -> None:
        self.table = table
        self.asked: list[str] = []

    def __call__(self, r: Request) -> tuple[float, ...]:
        self.asked.append(r.request_id)
        if r.status == RequestStatus.WAITING_FOR_STREAMING_REQ:
            return DORMANT
        return (self.table[r.request_id],)


def test_lowest_key_first_ties_in_entry_order() -> None:
    q = PolicyQueue(Keys({"a": 2.0, "b": 1.0, "c": 2.0, "d": 0.5}))
    for rid in "abcd":
        q.add_request(make_request(rid))
    assert [r.request_id for r in q] == ["d", "b", "a", "c"]
    assert [q.pop_request().request_id for _ in range(4)] == ["d", "b", "a", "c"]
    assert not q and len(q) == 0
    with pytest.raises(IndexError):
        q.pop_request()
    with pytest.raises(IndexError):
        q.peek_request()


def test_skipped_request_keeps_its_key_and_place_within_a_step() -> None:
    keys = Keys({"a": 1.0, "b": 2.0})
    q = PolicyQueue(keys)
    a, b = make_request("a"), make_request("b")
    q.add_request(a)
    q.add_request(b)
    keys.table["a"] = 9.0  # would sort last if it were asked again
    assert q.pop_request() is a
    q.prepend_requests([a])  # vLLM skipped it this step
    assert keys.asked == ["a", "b"]  # not asked again
    assert q.peek_request() is a
    # Next step: what was popped and comes back (e.g. preempted) is a new entry, asked again.
    assert q.pop_request() is a
    q.forget_popped()
    q.prepend_request(a)
    assert keys.asked == ["a", "b", "a"]
    assert [r.request_id for r in q] == ["b", "a"]


def test_dormant_entries_read_as_empty_but_are_counted() -> None:
    keys = Keys({"a": 1.0})
    q = PolicyQueue(keys)
    parked = make_request("p", parked=True)
    q.add_request(parked)
    assert not q  # vLLM moves on to the other queue at once
    assert len(q) == 1 and parked in q
    a = make_request("a")
    q.add_request(a)
    assert q and q.peek_request() is a  # a live entry sorts before the dormant one
    q.pop_request()
    assert not q
    # The session's next input arrived: rekeying makes it schedulable.
    parked.status = RequestStatus.WAITING
    keys.table["p"] = 3.0
    q.rekey({"p"})
    assert q and q.peek_request() is parked


def test_membership_and_removal() -> None:
    q = PolicyQueue(Keys({"a": 1.0, "b": 2.0, "c": 3.0}))
    a, b, c = (make_request(x) for x in "abc")
    for r in (a, b, c):
        q.add_request(r)
    q.remove_requests([b, make_request("elsewhere")])  # ids in other queues are ignored
    assert b not in q and a in q and "a" not in q  # membership is by Request
    assert [r.request_id for r in q] == ["a", "c"]
    q.remove_request(a)
    assert q.pop_request() is c
    assert a not in q and c not in q


def test_rescore_ranks_again_keeps_ties_in_entry_order_and_dormant_last() -> None:
    """A policy whose keys follow the batch state (`Traits.rescore_queued`): the scheduler
    asks every schedulable entry again at each step."""
    keys = Keys({"a": 1.0, "b": 2.0, "c": 3.0})
    q = PolicyQueue(keys)
    a, b, c = (make_request(x) for x in "abc")
    parked = make_request("p", parked=True)
    for r in (a, b, parked, c):
        q.add_request(r)
    assert [r.request_id for r in q] == ["a", "b", "c", "p"]
    keys.table.update({"a": 5.0, "b": 4.0, "c": 4.0})
    keys.asked.clear()
    q.rescore(lambda rs: [keys(r) for r in rs])
    assert sorted(keys.asked) == ["a", "b", "c"]  # the dormant entry is not asked
    # b and c tie: b entered first. a sorts behind them now; the parked one stays last.
    assert [r.request_id for r in q] == ["b", "c", "a", "p"]
    assert q.pop_request() is b and len(q) == 3
    PolicyQueue(keys).rescore(lambda rs: [keys(r) for r in rs])  # empty: nothing to ask
    assert sorted(keys.asked) == ["a", "b", "c"]
