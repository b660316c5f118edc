"""A softmax (multinomial logistic) regression head, trained by full-batch gradient descent.

A few thousand examples of a few hundred features: plain numpy, seconds to train, nothing to
install. Classes the training set never saw keep zero weights and are never predicted.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]


@dataclass(frozen=True)
class HeadConfig:
    l2: float = 1e-3  # weight decay: keeps rare buckets from fitting single examples
    steps: int = 800
    learning_rate: float = 0.5

    def __post_init__(self) -> None:
        if self.l2 < 0 or self.steps < 1 or self.learning_rate <= 0:
            raise ValueError(f"HeadConfig needs l2 >= 0, steps >= 1, learning_rate > 0: {self}")


def probabilities(x: Floats, weights: Floats) -> Floats:
    """Each row's probability per class (rows of `x` times `weights`, softmax)."""
    z = x @ weights
    z -= z.max(axis=1, keepdims=True)
    p = np.exp(z)
    out: Floats = p / p.sum(axis=1, keepdims=True)
    return out


def train(x: Floats, y: Ints, classes: int, config: HeadConfig | None = None) -> Floats:
    """Weights (features x classes) minimising cross-entropy plus `l2` times their square."""
    config = config or HeadConfig()
    if len(x) != len(y) or not len(x):
        raise ValueError(f"{len(x)} feature rows for {len(y)} labels")
    if y.min() < 0 or y.max() >= classes:
        raise ValueError(f"labels must be in [0, {classes}), got {y.min()}..{y.max()}")
    weights = np.zeros((x.shape[1], classes))
    onehot = np.eye(classes)[y]
    for _ in range(config.steps):
        grad = x.T @ (probabilities(x, weights) - onehot) / len(x) + config.l2 * weights
        weights -= config.learning_rate * grad
    return weights
