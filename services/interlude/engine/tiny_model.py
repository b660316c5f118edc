"""A tiny random-weight Llama built offline, for tests, the demo and the CPU benchmark.

No weights can be downloaded here (no hub), so the model is made from nothing: a byte-level BPE
tokenizer trained on text that ships with Python, with the tool-call markers as special tokens,
and a 2-layer Llama with random weights. Its output is gibberish, but deterministic under greedy
sampling, which is what scripted interceptions and the resume-equivalence tests need. The weights
are drawn with a wide initializer so greedy choices are decided by clear margins: KV recomputed
in a different batch shape then gives the same tokens as KV that was kept.

The ChatML chat template renders tool calls in the spec's `tool_format`: Hermes JSON (default) or
Qwen3-Coder XML, the two formats `ToolCallCodec` reads with vLLM's own tool parsers.

The model directory is keyed by `TinyModelSpec.key()`, so a changed spec builds a new one and an
existing one is reused (tests share one per session; `interlude demo` reuses it across runs).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

# Hermes-style markers: vLLM's `hermes` parser looks for exactly these strings.
TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"
SPECIAL_TOKENS = (
    "<s>",
    "</s>",
    "<pad>",
    "<|im_start|>",
    "<|im_end|>",
    TOOL_CALL_START,
    TOOL_CALL_END,
    "<tool_response>",
    "</tool_response>",
)

# ChatML with Hermes tool calls: what real Qwen/Hermes checkpoints use, so the engine's
# render-the-tool-result path is the one real models take.
CHAT_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nYou may call tools:\n"
    "{% for t in tools %}{{ t | tojson }}\n{% endfor %}<|im_end|>\n{% endif %}"
    "{% for m in messages %}"
    "{% if m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n"
    "</tool_response><|im_end|>\n"
    "{% elif m.role == 'assistant' and m.tool_calls %}<|im_start|>assistant\n"
    "{% if m.content %}{{ m.content }}{% endif %}"
    "{% for c in m.tool_calls %}<tool_call>\n"
    '{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments if c.function.arguments'
    " is string else c.function.arguments | tojson }}}\n</tool_call>{% endfor %}<|im_end|>\n"
    "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# Qwen3-Coder's XML tool calls (vLLM's `qwen3_coder` parser), trimmed from the real template:
# arguments become `<parameter=k>` blocks, consecutive tool results share one user turn.
QWEN3_CODER_CHAT_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nYou may call tools:\n"
    "{% for t in tools %}{{ t | tojson }}\n{% endfor %}<|im_end|>\n{% endif %}"
    "{% for m in messages %}"
    "{% if m.role == 'tool' %}"
    "{% if loop.first or messages[loop.index0 - 1].role != 'tool' %}<|im_start|>user{% endif %}"
    # An expression, not literal text: HF renders with trim_blocks, eating a newline after a tag.
    "{{ '\\n' }}<tool_response>\n{{ m.content }}\n</tool_response>"
    "{% if loop.last or messages[loop.index0 + 1].role != 'tool' %}<|im_end|>\n{% endif %}"
    "{% elif m.role == 'assistant' and m.tool_calls %}<|im_start|>assistant\n"
    "{% if m.content %}{{ m.content }}{% endif %}"
    "{% for c in m.tool_calls %}<tool_call>\n<function={{ c.function.name }}>\n"
    "{% for k, v in c.function.arguments | items %}<parameter={{ k }}>\n"
    "{{ v | tojson if v is mapping or (v is sequence and v is not string) else v | string }}"
    "\n</parameter>\n{% endfor %}</function>\n</tool_call>{% endfor %}<|im_end|>\n"
    "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# Tool-call format -> chat template; a format names the vLLM tool parser that reads it.
CHAT_TEMPLATES = {"hermes": CHAT_TEMPLATE, "qwen3_coder": QWEN3_CODER_CHAT_TEMPLATE}


@dataclass(frozen=True)
class TinyModelSpec:
    """Shape of the tiny model; every field changes what is built, so all are in the cache key."""

    vocab_size: int = 512  # BPE merges stop here; small keeps the LM head cheap on CPU
    hidden_size: int = 256
    intermediate_size: int = 512
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    max_position_embeddings: int = 8192
    initializer_range: float = 0.5  # wide: clear greedy margins (see module docstring)
    seed: int = 0
    tool_format: str = "hermes"  # a CHAT_TEMPLATES key: how the chat template renders tool calls

    def __post_init__(self) -> None:
        if self.tool_format not in CHAT_TEMPLATES:
            choices = sorted(CHAT_TEMPLATES)
            raise ValueError(
                f"TinyModelSpec.tool_format {self.tool_format!r}: choose from {choices}"
            )
        if self.vocab_size < len(SPECIAL_TOKENS) + 256:
            raise ValueError("TinyModelSpec.vocab_size must cover the 256 bytes and specials")
        if self.hidden_size % self.num_heads or self.num_heads % self.num_kv_heads:
            raise ValueError(
                "TinyModelSpec: heads must divide hidden_size and kv heads divide heads"
            )

    def key(self) -> str:
        return "tiny-llama-" + "-".join(str(v) for v in asdict(self).values())


def default_cache_dir() -> Path:
    """Where tiny models live unless `INTERLUDE_MODEL_CACHE` says otherwise."""
    from interlude.env import load_env

    configured = load_env().model_cache
    if configured:
        return Path(configured)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "interlude" / "models"


def _training_text() -> list[str]:
    """Local text to train the tokenizer on: Python's own library sources (always present)."""
    import inspect
    import json as json_mod
    import textwrap

    texts = [inspect.getsource(m) for m in (textwrap, json_mod.decoder, json_mod.encoder)]
    texts.append('{"name": "calculator", "arguments": {"expression": "12 * (3 + 4)"}}')
    return texts


def _build_tokenizer(spec: TinyModelSpec, out: Path) -> int:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_training_text(), trainer=trainer)
    fast = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        additional_special_tokens=list(SPECIAL_TOKENS[3:]),
    )
    fast.chat_template = CHAT_TEMPLATES[spec.tool_format]
    fast.save_pretrained(out)
    return int(tok.get_vocab_size())


def _build_weights(spec: TinyModelSpec, vocab: int, out: Path) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(spec.seed)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        max_position_embeddings=spec.max_position_embeddings,
        initializer_range=spec.initializer_range,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=2,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config)  # type: ignore[no-untyped-call]
    model.save_pretrained(out, safe_serialization=True)


def build_tiny_model(spec: TinyModelSpec | None = None, cache_dir: Path | None = None) -> Path:
    """Return the directory of the tiny model for `spec`, building it on first use (seconds).

    Side effects: writes under `cache_dir`; the build goes to a temporary sibling first and is
    renamed into place, so a crashed or concurrent build never leaves a half-written model.
    """
    spec = spec or TinyModelSpec()
    root = cache_dir or default_cache_dir()
    target = root / spec.key()
    if (target / "config.json").exists():
        return target
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=root))
    try:
        vocab = _build_tokenizer(spec, tmp)
        _build_weights(spec, vocab, tmp)
        (tmp / "interlude-spec.json").write_text(json.dumps(asdict(spec), indent=2))
        try:
            tmp.rename(target)
        except OSError:
            if not (target / "config.json").exists():  # lost a race only if the winner finished
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
