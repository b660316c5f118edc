"""ToolCallCodec on the tiny model's real tokenizer, loaded as vLLM's engine loads it (no engine).

One tiny model per tool format; the grammars of forced calls are compiled by the real xgrammar
and stepped with its matcher, as vLLM's structured-output backend does.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from interlude.engine.tiny_model import TinyModelSpec, build_tiny_model
from interlude.engine.toolcalls import TOOL_PARSERS, ParsedTurn, ToolCallCodec, ToolCallRequest

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate arithmetic.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}, "digits": {"type": "integer"}},
                "required": ["expression"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search",
            "parameters": {"type": "object", "properties": {"query": {"type": "string"}}},
        },
    },
]
MESSAGES: list[dict[str, Any]] = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is 2+3?"},
]
# The same call written in each format, as the tiny model's templates render it.
CALL_TEXT = {
    "hermes": '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2+3"}}\n',
    "qwen3_coder": (
        "<tool_call>\n<function=calculator>\n<parameter=expression>\n2+3\n</parameter>\n"
        "</function>\n"
    ),
}


def _tokenizer(path: Path) -> Any:
    """What `AsyncLLM.get_tokenizer()` returns: vLLM's cached HF tokenizer in a thread pool."""
    from vllm.tokenizers import get_tokenizer, maybe_make_thread_pool

    return maybe_make_thread_pool(get_tokenizer(str(path)), 2)


@pytest.fixture(scope="module")
def tokenizers(tiny_model: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    qwen = TinyModelSpec(tool_format="qwen3_coder")
    qwen_path = build_tiny_model(qwen, cache_dir=tmp_path_factory.mktemp("qwen-model"))
    return {"hermes": _tokenizer(Path(tiny_model)), "qwen3_coder": _tokenizer(qwen_path)}


@pytest.fixture(scope="module", params=TOOL_PARSERS)
def codec(request: pytest.FixtureRequest, tokenizers: dict[str, Any]) -> ToolCallCodec:
    return ToolCallCodec(tokenizers[request.param], request.param)


def _decode(codec: ToolCallCodec, ids: list[int]) -> str:
    return str(codec.tokenizer.decode(ids, skip_special_tokens=False))


_IDS = itertools.count()


def _call(name: str = "calculator", **arguments: Any) -> ToolCallRequest:
    return ToolCallRequest(f"call_{next(_IDS)}", name, json.dumps(arguments))


def test_unknown_parser_and_mismatched_template_raise(tokenizers: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="unknown tool parser"):
        ToolCallCodec(tokenizers["hermes"], "pythonic")
    with pytest.raises(ValueError, match="does not render tool calls"):
        ToolCallCodec(tokenizers["hermes"], "qwen3_coder")


def test_tokenizer_without_markers_raises() -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE(unk_token=None))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    bpe.train_from_iterator(["plain text without any markers"], trainer=trainer)
    plain = PreTrainedTokenizerFast(tokenizer_object=bpe)  # type: ignore[no-untyped-call]
    with pytest.raises(ValueError, match="no single token"):
        ToolCallCodec(plain)


def test_stop_token_ids_are_the_closing_marker(codec: ToolCallCodec) -> None:
    end = codec.tokenizer.convert_tokens_to_ids("</tool_call>")
    assert codec.stop_token_ids == (end,)
    assert (
        codec.ends_call([5, 9, end]) and not codec.ends_call([end, 9]) and not codec.ends_call([])
    )
    assert end not in codec.forced_logit_bias
    assert codec.tokenizer.eos_token_id in codec.forced_logit_bias


@pytest.mark.parametrize("closed", [False, True])
def test_parse_single_call_and_content(codec: ToolCallCodec, closed: bool) -> None:
    text = CALL_TEXT[codec.parser] + ("</tool_call>" if closed else "")
    turn = codec.parse(text, TOOLS)
    assert turn.content == ""
    assert [(c.name, json.loads(c.arguments)) for c in turn.calls] == [
        ("calculator", {"expression": "2+3"})
    ]
    assert turn.calls[0].id.startswith("call_")
    again = codec.parse("Let me compute. " + text, TOOLS)
    # Qwen3's parser trims the space before the call; Hermes's keeps it.
    assert again.content.rstrip() == "Let me compute." and len(again.calls) == 1
    assert again.calls[0].id != turn.calls[0].id


def test_parse_typed_arguments_follow_the_schema(codec: ToolCallCodec) -> None:
    text = {
        "hermes": '<tool_call>\n{"name": "calculator", "arguments": {"expression": "1", '
        '"digits": 3}}\n',
        "qwen3_coder": "<tool_call>\n<function=calculator>\n<parameter=expression>\n1\n"
        "</parameter>\n<parameter=digits>\n3\n</parameter>\n</function>\n",
    }[codec.parser]
    (call,) = codec.parse(text, TOOLS).calls
    assert json.loads(call.arguments) == {"expression": "1", "digits": 3}


@pytest.mark.parametrize(
    "text",
    [
        "The answer is 5.",
        '<tool_call>\n{"name": "calcul',  # cut off inside the call
        "<tool_call>\n<function=calculator>\n<parameter=expr",
        "<tool_call>\nnot a call at all\n</tool_call>",
        '<tool_call>\n{"name": "calculator", "arguments": "2+3"}\n',  # arguments not an object
    ],
)
def test_parse_answer_or_malformed_call_is_all_content(codec: ToolCallCodec, text: str) -> None:
    assert codec.parse(text, TOOLS) == ParsedTurn(content=text, calls=())


def test_assistant_and_tool_messages(codec: ToolCallCodec) -> None:
    call = _call(expression="2+3")
    msg = codec.assistant_message(ParsedTurn("", (call,)))
    assert msg["content"] is None
    assert msg["tool_calls"] == [
        {
            "id": call.id,
            "type": "function",
            "function": {"name": "calculator", "arguments": call.arguments},
        }
    ]
    assert codec.assistant_message(ParsedTurn("5", ())) == {"role": "assistant", "content": "5"}
    with pytest.raises(ValueError, match="the calls are"):
        codec.tool_messages(
            ParsedTurn("", (call,)), [{"tool_call_id": "call_other", "content": "5"}]
        )
    with pytest.raises(ValueError, match="needs a turn with tool calls"):
        codec.continuation(MESSAGES, TOOLS, ParsedTurn("5", ()), [])


def test_continuation_shape(codec: ToolCallCodec) -> None:
    turn = codec.parse(CALL_TEXT[codec.parser], TOOLS)
    results = [{"tool_call_id": turn.calls[0].id, "content": "RESULT=5"}]
    cont = codec.continuation(MESSAGES, TOOLS, turn, results)
    assert cont[:1] == list(codec.stop_token_ids)  # the stop token vLLM left out of the context
    text = _decode(codec, cont)
    assert "RESULT=5" in text
    assert text.endswith("<|im_start|>assistant\n")
    assert text.count("<tool_call>") == 0  # the call itself is already in the context


def _generated(codec: ToolCallCodec, history: list[dict[str, Any]], turn: ParsedTurn) -> list[int]:
    """The turn's tokens as the model would generate them: the template's text up to the stop."""
    before = _decode(codec, codec.render_prompt(history, TOOLS))
    whole = _decode(codec, codec.render_prompt([*history, codec.assistant_message(turn)], TOOLS))
    text = whole[len(before) : whole.rindex("</tool_call>")]
    return [int(i) for i in codec.tokenizer.encode(text, add_special_tokens=False)]


@pytest.mark.parametrize(
    "turns",
    [
        [ParsedTurn("", (_call(expression="2+3"),))],
        [ParsedTurn("Let me compute. ", (_call(expression="2+3", digits=2),))],
        # Two pauses in one session, the second one with parallel calls.
        [
            ParsedTurn("", (_call(expression="2+3"),)),
            ParsedTurn("", (_call("search", query="five"), _call(expression="5*5"))),
        ],
    ],
    ids=["call", "content+call", "two-pauses"],
)
def test_session_context_equals_rendered_history(
    codec: ToolCallCodec, turns: list[ParsedTurn]
) -> None:
    """The KEY invariant: what the parked session holds is the history the template renders."""
    history = [dict(m) for m in MESSAGES]
    context = codec.render_prompt(history, TOOLS)
    for i, turn in enumerate(turns):
        context += _generated(codec, history, turn)  # vLLM keeps the turn minus its stop token
        results = [{"tool_call_id": c.id, "content": f"result {i}.{c.name}"} for c in turn.calls]
        context += codec.continuation(history, TOOLS, turn, results)
        history += [codec.assistant_message(turn), *codec.tool_messages(turn, results)]
        text = _decode(codec, context)
        assert text == _decode(codec, codec.render_prompt(history, TOOLS))
        assert all(r["content"] in text for r in results)


def _matcher(codec: ToolCallCodec, structured: Any) -> Any:
    """The grammar as vLLM's xgrammar backend compiles it for a request stopping at the marker."""
    import xgrammar as xgr
    from vllm import SamplingParams
    from vllm.v1.structured_output.backend_xgrammar import validate_xgrammar_grammar

    validate_xgrammar_grammar(SamplingParams(structured_outputs=structured))
    tok = codec.tokenizer
    compiler = xgr.GrammarCompiler(xgr.TokenizerInfo.from_huggingface(tok, vocab_size=len(tok)))
    stops = [*codec.stop_token_ids, tok.eos_token_id]
    compiled = compiler.compile_structural_tag(structured.structural_tag)
    return xgr.GrammarMatcher(compiled, override_stop_tokens=stops)


def _allowed(codec: ToolCallCodec, matcher: Any) -> list[int]:
    import xgrammar as xgr

    size = len(codec.tokenizer)
    mask = xgr.allocate_token_bitmask(1, size)
    matcher.fill_next_token_bitmask(mask)
    return [i for i in range(size) if (int(mask[0, i // 32]) >> (i % 32)) & 1]


@pytest.mark.parametrize("choice", ["required", "calculator"])
def test_forced_call_accepts_the_rendered_call_then_the_stop_token(
    codec: ToolCallCodec, choice: str
) -> None:
    matcher = _matcher(codec, codec.forced_call(TOOLS, choice))
    start = codec.tokenizer.convert_tokens_to_ids("<tool_call>")
    assert _allowed(codec, matcher) == [start]  # the marker token, never spelled in pieces
    for token in codec.tokenizer.encode(CALL_TEXT[codec.parser], add_special_tokens=False):
        assert matcher.accept_token(token)
    assert matcher.accept_token(codec.stop_token_ids[0]) and matcher.is_terminated()
    with pytest.raises(ValueError, match="names no tool"):
        codec.forced_call(TOOLS, "weather")


def test_forced_turn_allows_exactly_its_tokens(codec: ToolCallCodec) -> None:
    text = CALL_TEXT[codec.parser]
    matcher = _matcher(codec, codec.forced_turn(text + "</tool_call>"))
    for token in codec.tokenizer.encode(text, add_special_tokens=False):
        assert _allowed(codec, matcher) == [token]
        assert matcher.accept_token(token)
    # Complete: only stop ids, and `forced_logit_bias` leaves the closing marker the only choice.
    allowed = _allowed(codec, matcher)
    assert [t for t in allowed if t not in codec.forced_logit_bias] == list(codec.stop_token_ids)
    with pytest.raises(ValueError, match="closing marker"):
        codec.forced_turn("</tool_call>")
