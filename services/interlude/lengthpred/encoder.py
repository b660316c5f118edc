"""Text to vectors for the length predictor, with weights that come from the package index.

`WordLlamaEncoder`: WordLlama's `l2_supercat_256`, static token embeddings distilled from
Llama-2-class models' input embeddings (a 32,000 x 256 table, 16 MB, MIT), shipped inside the
`wordllama` wheel: nothing is downloaded, and a prompt costs tens of microseconds on a CPU,
next to the milliseconds of a transformer encoder (MiniLM-class) for what a length bucket
needs. wordllama 0.4's own `WordLlama.load()` looks for the bundled tokenizer under
`tokenizer/` while the wheel ships it under `tokenizers/`, then tries Hugging Face; we load
the two files ourselves and build its inference class from them.
"""

from __future__ import annotations

import functools
import warnings
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

Vectors = npt.NDArray[np.float32]


class Encoder(Protocol):
    """Texts to fixed-size vectors. No side effects after construction; the same text gives
    the same vector (what a saved model relies on: it names its encoder, not its outputs)."""

    name: str
    dim: int

    def embed(self, texts: list[str]) -> Vectors: ...


class WordLlamaEncoder:
    """WordLlama's bundled 256-dimension model (the module docstring says why this one)."""

    name = "wordllama-l2-supercat-256"
    dim = 256

    def __init__(self) -> None:
        self._model = _bundled_wordllama()

    def embed(self, texts: list[str]) -> Vectors:
        return np.asarray(self._model.embed(texts), dtype=np.float32)


@functools.cache
def _bundled_wordllama() -> Any:
    import wordllama  # type: ignore[import-untyped]
    from safetensors import safe_open
    from tokenizers import Tokenizer
    from wordllama.inference import WordLlamaInference  # type: ignore[import-untyped]

    root = Path(wordllama.__file__).parent
    tokenizer = Tokenizer.from_file(str(root / "tokenizers" / "l2_supercat_tokenizer_config.json"))
    with safe_open(str(root / "weights" / "l2_supercat_256.safetensors"), "np") as f:
        table = f.get_tensor("embedding.weight")
    with warnings.catch_warnings():  # its truncation notice, once per long text
        warnings.simplefilter("ignore")
        return WordLlamaInference(table, tokenizer, binary=False)


ENCODERS = {WordLlamaEncoder.name: WordLlamaEncoder}


def encoder(name: str) -> Encoder:
    """The encoder a saved model names; ValueError for one this build does not have."""
    try:
        return ENCODERS[name]()
    except KeyError:
        raise ValueError(f"unknown encoder {name!r} (known: {', '.join(ENCODERS)})") from None
