"""The predictor on held-out conversations, next to what it must beat and to the paper.

For each granularity: bucket accuracy of the predictor; of the most common training bucket;
of each kind's most common bucket; and of the bucket of each kind's mean length (the number
the policies use today, `policy/predict.py`); the mean absolute error of the expected output
length against each kind's mean; and the predictor's cost per request, one prompt at a time.
TetriInfer's accuracies (section 5.3: OPT-125M on ShareGPT-like prompts) stand beside them
for 100, 200 and 400; our outputs are shorter (96 % of the trace's text completions are under
100 tokens, most end at 256 characters), so at those granularities nearly every output is in
the first bucket and the
baselines are as good as any model: the finer granularities are where the comparison says
something.
"""

from __future__ import annotations

import statistics
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from interlude.lengthpred.data import Sample
from interlude.lengthpred.encoder import Encoder
from interlude.lengthpred.model import LengthPredictor, bucket_of

PAPER = {100: 0.589, 200: 0.749, 400: 0.85}  # TetriInfer, Figure 14 (their granularities)


@dataclass(frozen=True)
class Row:
    """One granularity's results (accuracies are shares of held-out segments)."""

    granularity: int
    buckets: int
    held_out: int
    accuracy: float
    majority: float  # always the most common training bucket
    kind_majority: float  # each kind's most common training bucket
    kind_mean: float  # the bucket of each kind's mean length
    paper: float | None
    mae_tokens: float  # |expected - actual| output tokens, the predictor's expectation
    mae_likeliest: float  # the same for the mean length of its likeliest bucket
    mae_kind_mean: float  # the same for each kind's mean length
    ms_per_request: float  # features and head for one prompt (median)


def evaluate(
    train: Sequence[Sample], test: Sequence[Sample], granularity: int, enc: Encoder
) -> Row:
    """Train on `train` at `granularity`, measure on `test` beside the baselines."""
    model = LengthPredictor.fit(train, granularity, enc)
    g, n = granularity, model.buckets
    truth = [bucket_of(s.tokens, g, n) for s in test]
    # One pass of the encoder over the held-out prompts serves both estimates.
    p = model.probabilities(enc, [s.prompt for s in test], [s.kind for s in test])
    predicted, expected = model.likeliest(p), model.expectation(p)
    common = Counter(bucket_of(s.tokens, g, n) for s in train).most_common(1)[0][0]
    by_kind: dict[str, list[int]] = {}
    for s in train:
        by_kind.setdefault(s.kind, []).append(s.tokens)
    kind_mean = {k: statistics.fmean(v) for k, v in by_kind.items()}
    kind_common = {
        k: Counter(bucket_of(t, g, n) for t in v).most_common(1)[0][0] for k, v in by_kind.items()
    }
    overall = statistics.fmean(s.tokens for s in train)

    def share(guesses: Sequence[int]) -> float:
        return sum(a == b for a, b in zip(guesses, truth, strict=True)) / len(truth)

    return Row(
        granularity=g,
        buckets=n,
        held_out=len(test),
        accuracy=share(predicted),
        majority=share([common] * len(test)),
        kind_majority=share([kind_common.get(s.kind, common) for s in test]),
        kind_mean=share([bucket_of(round(kind_mean.get(s.kind, overall)), g, n) for s in test]),
        paper=PAPER.get(g),
        mae_tokens=statistics.fmean(abs(e - s.tokens) for e, s in zip(expected, test, strict=True)),
        mae_likeliest=statistics.fmean(
            abs(model.bucket_tokens[b] - s.tokens) for b, s in zip(predicted, test, strict=True)
        ),
        mae_kind_mean=statistics.fmean(
            abs(kind_mean.get(s.kind, overall) - s.tokens) for s in test
        ),
        ms_per_request=_cost_ms(model, enc, test[:50]),
    )


def _cost_ms(model: LengthPredictor, enc: Encoder, samples: Sequence[Sample]) -> float:
    times = []
    for s in samples:
        started = time.perf_counter()
        model.predict(enc, [s.prompt], [s.kind])
        times.append(1000 * (time.perf_counter() - started))
    return statistics.median(times)


def as_dicts(rows: Sequence[Row]) -> list[dict[str, object]]:
    return [asdict(r) for r in rows]
