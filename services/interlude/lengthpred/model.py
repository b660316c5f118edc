"""The length predictor as one object: features, buckets, head weights; saved as one file.

Features of a prompt: the encoder's vector of its last 600 characters (the turn being
answered: "reply 'ready'" or "summarise this") and of its last 4,000 (the conversation), the
log of its length in tokens, and its kind one-hot (what the policies' per-kind means know
too). Buckets are TetriInfer's: [0, g), [g, 2g), ... of granularity g, the last one open.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from interlude.lengthpred.data import Sample
from interlude.lengthpred.encoder import Encoder, encoder
from interlude.lengthpred.head import Floats, HeadConfig, probabilities, train
from interlude_workloads.trace import estimate_tokens

TAIL_CHARS, CONTEXT_CHARS = 600, 4000
MAX_BUCKETS = 64  # longer outputs share the last, open bucket


def bucket_of(tokens: int, granularity: int, buckets: int) -> int:
    """The bucket of an output of `tokens` tokens: [0, g) is 0, ..., the last one open."""
    return min(tokens // granularity, buckets - 1)


# eq=False: it holds an array, which has no truth value to compare or hash by.
@dataclass(frozen=True, eq=False)
class LengthPredictor:
    """A trained predictor. Immutable; `fit` makes one, `save`/`load` keep it as one file."""

    granularity: int
    buckets: int
    kinds: tuple[str, ...]  # the one-hot's order; an unknown kind gets all zeros
    encoder_name: str
    weights: Floats  # features x buckets
    bucket_tokens: tuple[float, ...]  # the mean length of training outputs in each bucket

    def __post_init__(self) -> None:
        if self.granularity < 1 or not 1 <= self.buckets <= MAX_BUCKETS:
            raise ValueError(f"granularity {self.granularity}, buckets {self.buckets}")
        if self.weights.shape[1] != self.buckets or len(self.bucket_tokens) != self.buckets:
            raise ValueError(f"weights {self.weights.shape} for {self.buckets} buckets")

    @classmethod
    def fit(
        cls,
        samples: Sequence[Sample],
        granularity: int,
        enc: Encoder,
        config: HeadConfig | None = None,
    ) -> LengthPredictor:
        """Train on `samples` (Side effects: none; seconds for the trace's ~900)."""
        if granularity < 1:
            raise ValueError(f"granularity must be >= 1, got {granularity}")
        buckets = min(MAX_BUCKETS, max(s.tokens for s in samples) // granularity + 1)
        kinds = tuple(sorted({s.kind for s in samples}))
        x = features(enc, [s.prompt for s in samples], [s.kind for s in samples], kinds)
        y = np.array([bucket_of(s.tokens, granularity, buckets) for s in samples])
        means = []
        for b in range(buckets):
            inside = [s.tokens for s in samples if bucket_of(s.tokens, granularity, buckets) == b]
            means.append(sum(inside) / len(inside) if inside else (b + 0.5) * granularity)
        return cls(
            granularity, buckets, kinds, enc.name, train(x, y, buckets, config), tuple(means)
        )

    def probabilities(self, enc: Encoder, prompts: list[str], kinds: list[str]) -> Floats:
        if enc.name != self.encoder_name:
            raise ValueError(f"trained with encoder {self.encoder_name!r}, given {enc.name!r}")
        return probabilities(features(enc, prompts, kinds, self.kinds), self.weights)

    def predict(self, enc: Encoder, prompts: list[str], kinds: list[str]) -> list[int]:
        """Each prompt's most likely bucket."""
        return self.likeliest(self.probabilities(enc, prompts, kinds))

    def expected_tokens(self, enc: Encoder, prompts: list[str], kinds: list[str]) -> list[float]:
        """Each prompt's expected output length: bucket probabilities times bucket means."""
        return self.expectation(self.probabilities(enc, prompts, kinds))

    def likeliest(self, p: Floats) -> list[int]:
        """The likeliest bucket of each row of `probabilities`' output."""
        return [int(b) for b in p.argmax(axis=1)]

    def expectation(self, p: Floats) -> list[float]:
        """The expected length of each row of `probabilities`' output."""
        return [float(v) for v in p @ np.array(self.bucket_tokens)]

    def save(self, path: Path) -> None:
        meta = {
            "granularity": self.granularity,
            "buckets": self.buckets,
            "kinds": list(self.kinds),
            "encoder": self.encoder_name,
            "bucket_tokens": list(self.bucket_tokens),
        }
        with path.open("wb") as f:
            np.savez(f, weights=self.weights, meta=np.array(json.dumps(meta)))

    @classmethod
    def load(cls, path: Path) -> tuple[LengthPredictor, Encoder]:
        """The model saved at `path` and the encoder it was trained with."""
        with np.load(path, allow_pickle=False) as f:
            meta, weights = json.loads(str(f["meta"])), f["weights"]
        model = cls(
            meta["granularity"],
            meta["buckets"],
            tuple(meta["kinds"]),
            meta["encoder"],
            weights,
            tuple(meta["bucket_tokens"]),
        )
        return model, encoder(model.encoder_name)


def features(enc: Encoder, prompts: list[str], kinds: list[str], known: Sequence[str]) -> Floats:
    """One row per prompt: the module docstring's features, `known` kinds one-hot."""
    tails = enc.embed([p[-TAIL_CHARS:] for p in prompts])
    context = enc.embed([p[-CONTEXT_CHARS:] for p in prompts])
    size = np.array([[math.log1p(estimate_tokens(p)) / 8] for p in prompts])
    onehot = np.array([[k == kind for kind in known] for k in kinds], dtype=float)
    bias = np.ones((len(prompts), 1))
    return np.hstack([tails, context, size, onehot.reshape(len(prompts), len(known)), bias])
