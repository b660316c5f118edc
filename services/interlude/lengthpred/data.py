"""The predictor's examples: each text segment of the shared trace, its prompt, its kind and
how many tokens its completion took, split into training and held-out conversations.

A conversation's segments share their prompt's beginning (each prompt holds the ones before),
so the split is by conversation, never by segment: a held-out segment's context was never seen
in training. Token counts are the trace loader's estimate (`estimate_tokens`), the same the
load generator sends. The trace's token-count requests (math, venv, qa) have no text and are
left out.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from interlude_workloads.trace import classify, estimate_tokens


@dataclass(frozen=True)
class Sample:
    """One segment: what the model was asked (the whole conversation so far) and how long
    its answer was."""

    conversation: str
    kind: str  # chat, tts or image (`classify`)
    prompt: str
    tokens: int  # the completion's length in tokens


def load_samples(path: Path) -> list[Sample]:
    """Every text segment of the trace at `path`, in file order."""
    raw = json.loads(path.read_text())
    out: list[Sample] = []
    for rid, segs in raw.items():
        if not segs or "prompt" not in segs[0]:
            continue
        calls = [s for s in segs if "api_time" in s]
        kind = classify([float(s["api_time"]) for s in calls], [s["api_token"] for s in calls])
        out += [Sample(rid, kind, s["prompt"], estimate_tokens(s["completion"])) for s in segs]
    if not out:
        raise ValueError(f"{path}: no text segments (prompt and completion) to learn from")
    return out


def held_out(conversation: str, share: float) -> bool:
    """Whether `conversation` is in the held-out split: a hash of its id, so the split is the
    same on every machine and does not move when conversations are added."""
    digest = hashlib.sha256(conversation.encode()).digest()
    return int.from_bytes(digest[:4], "big") < share * 2**32


def split(samples: Sequence[Sample], share: float = 0.25) -> tuple[list[Sample], list[Sample]]:
    """(training, held-out) samples, about `share` of the conversations held out."""
    if not 0 < share < 1:
        raise ValueError(f"the held-out share must be in (0, 1), got {share}")
    train = [s for s in samples if not held_out(s.conversation, share)]
    test = [s for s in samples if held_out(s.conversation, share)]
    if not train or not test:
        raise ValueError(f"a {share} split of {len(samples)} samples leaves one side empty")
    return train, test
