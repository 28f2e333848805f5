"""Assistant masks under chat templates as users have them: a Qwen3-style thinking template over
multi-turn data (checked token by token, and trained on), `{% generation %}` markers, template
kwargs and a template file override, and rows whose replies cannot be located."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from templates import CHATML, CHATML_MARKED, QWEN3_STYLE

import splitserve.train.loop as loop
from splitserve.config import DataConfig, DraftConfig, EvalConfig, RunConfig, TargetConfig, TrainConfig
from splitserve.data import ChatTemplate, DataError, LoadOptions, encode_prompt, load_samples, tokenize_conversation
from splitserve.target.hf import load_hf_target

S, U, A, E = "<|im_start|>system\n", "<|im_start|>user\n", "<|im_start|>assistant\n", "<|im_end|>"
EMPTY_THINK = "<think>\n\n</think>\n\n"

CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi there"},
    {"role": "assistant", "content": "<think>they greet me</think>Hello! How can I help?"},
    {"role": "user", "content": "What is two plus two?"},
    {"role": "assistant", "content": "Four."},
    {"role": "user", "content": "And times three?"},
    {"role": "assistant", "content": "Twelve."},
]


def qwen3_expected(thinking: bool) -> list[tuple[str, bool]]:
    """CONVERSATION as the Qwen3-style template draws it, cut into (text, trained) pieces by hand:
    earlier replies plain (their reasoning dropped), the last one behind a think block that the
    model generates unless the generation prompt already holds it (enable_thinking=false)."""
    last_header = [(A, False), (EMPTY_THINK, True)] if thinking else [(A + EMPTY_THINK, False)]
    return [
        (S + "Be brief." + E + "\n" + U + "Hi there" + E + "\n" + A, False),
        ("Hello! How can I help?" + E, True),
        ("\n" + U + "What is two plus two?" + E + "\n" + A, False),
        ("Four." + E, True),
        ("\n" + U + "And times three?" + E + "\n", False),
        *last_header,
        ("Twelve." + E, True),
        ("\n", False),
    ]


def expected_mask(tok, pieces: list[tuple[str, bool]]) -> tuple[list[int], list[int]]:
    text = "".join(t for t, _ in pieces)
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    trained, at = [], 0
    for piece, train in pieces:
        if train:
            trained.append((at, at + len(piece)))
        at += len(piece)
    mask = [int(any(a <= start < b for a, b in trained)) for start, _ in enc["offset_mapping"]]
    return list(enc["input_ids"]), mask


@pytest.mark.parametrize("thinking", [True, False])
def test_qwen3_template_multi_turn_masks_token_by_token(smollm2_tokenizer, thinking):
    tok = smollm2_tokenizer
    chat = ChatTemplate(QWEN3_STYLE, {} if thinking else {"enable_thinking": False})
    pieces = qwen3_expected(thinking)
    assert tok.apply_chat_template(CONVERSATION, chat_template=QWEN3_STYLE, tokenize=False,
                                   **chat.kwargs) == "".join(t for t, _ in pieces)
    ids, mask = expected_mask(tok, pieces)
    sample = tokenize_conversation(tok, CONVERSATION, max_length=512, chat=chat)
    assert sample.input_ids == ids
    assert sample.loss_mask == mask
    if not thinking:
        return  # the prompt then ends in "\n\n", which SmolLM2's vocabulary merges with the reply
    # The prompt the server would build for the last reply ends exactly where its training starts.
    prompt = encode_prompt(tok, CONVERSATION[:-1], chat)
    assert sample.input_ids[: len(prompt)] == prompt and sample.loss_mask[len(prompt)] == 1
    assert not any(sample.loss_mask[: len(prompt)][-3:])


def test_generation_markers_give_the_located_masks(smollm2_tokenizer):
    """Two ways to the same mask: transformers' {% generation %} mask and the span finder."""
    tok = smollm2_tokenizer
    messages = [m for m in CONVERSATION if "<think>" not in m["content"]]
    marked = tokenize_conversation(tok, messages, 512, chat=ChatTemplate(CHATML_MARKED))
    located = tokenize_conversation(tok, messages, 512, chat=ChatTemplate(CHATML))
    assert marked.input_ids == located.input_ids
    assert marked.loss_mask == located.loss_mask
    assert tok.decode([t for t, m in zip(marked.input_ids, marked.loss_mask) if m]) == "Four." + E + "Twelve." + E


def test_unlocatable_rows_are_skipped_and_counted(tmp_path, smollm2_tokenizer):
    # A template that rewrites the reply text: nothing of it can be found verbatim.
    shouting = CHATML.replace("m.content + '<|im_end|>'", "m.content|upper + '<|im_end|>'")
    rows = [{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "ANSWER"}]},
            {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "quiet"}]}]
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    opts = LoadOptions(chat=ChatTemplate(shouting))
    samples, stats = load_samples(path, smollm2_tokenizer, 64, opts=opts)
    assert [s.source for s in samples] == [f"{path}:1"]
    assert stats.skipped["unlocated"] == [f"{path}:2"]
    assert f"1 whose replies the chat template does not reproduce at {path}:2;" in stats.summary()
    with pytest.raises(DataError, match=r"rows\.jsonl:2: the chat template does not render messages\[1\]"):
        load_samples(path, smollm2_tokenizer, 64, opts=LoadOptions(chat=opts.chat, strict=True))


def test_template_file_and_kwargs_from_config(tmp_path):
    from splitserve.data import load_options

    (tmp_path / "t.jinja").write_text(QWEN3_STYLE)
    opts = load_options(DataConfig(chat_template=str(tmp_path / "t.jinja"),
                                   chat_template_kwargs={"enable_thinking": False}, strict=True, num_proc=2))
    assert opts.chat.template == QWEN3_STYLE and opts.chat.kwargs == {"enable_thinking": False}
    assert opts.strict and opts.num_proc == 2
    with pytest.raises(DataError, match=r"chat template .*missing\.jinja: cannot be read"):
        ChatTemplate.load(str(tmp_path / "missing.jinja"))


def test_train_on_qwen3_template_multi_turn(tiny_smol_dir, tmp_path, monkeypatch):
    """A few training steps with the Qwen3-style template from a file; every sample's mask is the
    hand-cut one."""
    monkeypatch.setenv("SPLITSERVE_CACHE", str(tmp_path / "cache"))
    (tmp_path / "qwen3.jinja").write_text(QWEN3_STYLE)
    data = tmp_path / "multi.jsonl"
    data.write_text("".join(json.dumps({"messages": CONVERSATION}) + "\n" for _ in range(4)))
    cfg = RunConfig(
        target=TargetConfig(name="tiny-smol", path=str(tiny_smol_dir), layer_ids=[0, 1, 2], device="cpu"),
        draft=DraftConfig(num_layers=1, block_size=4, markov_rank=4, intermediate_size=32),
        data=DataConfig(train_path=str(data), max_length=128, chat_template=str(tmp_path / "qwen3.jinja")),
        train=TrainConfig(max_steps=2, batch_size=2, anchors_per_seq=4, save_every=100, log_every=1, device="cpu"),
        eval=EvalConfig(enabled=False),
        run_dir=str(tmp_path / "run"),
    )
    target = load_hf_target(cfg.target)
    source = loop.build_source(cfg, target)
    ids, mask = expected_mask(target.tokenizer, qwen3_expected(thinking=True))
    assert source.num_samples == 4
    for s in source.samples:
        assert (s.input_ids, s.loss_mask) == (ids, mask)
    result = loop.train(cfg, target)
    assert result.state.step == 2
    losses = [json.loads(line)["loss"] for line in Path(cfg.run_dir, "metrics.jsonl").read_text().splitlines()]
    assert len(losses) == 2 and all(loss == loss and loss > 0 for loss in losses)


def test_serve_request_kwargs_reach_the_template(smollm2_tokenizer):
    """A chat request's chat_template_kwargs reach the template, rendered exactly as training
    renders the same conversation; kwargs that are not an object are refused before rendering."""
    import copy

    from pydantic import ValidationError

    from splitserve.serve.protocol import ChatCompletionRequest, encode_chat

    tok = copy.deepcopy(smollm2_tokenizer)
    tok.chat_template = QWEN3_STYLE
    messages = [{"role": "user", "content": "Hi there"}]
    body = {"messages": messages, "chat_template_kwargs": {"enable_thinking": False}}
    ids = encode_chat(ChatCompletionRequest.model_validate(body), tok)
    assert tok.decode(ids).endswith(A + EMPTY_THINK)
    assert ids == encode_prompt(tok, messages, ChatTemplate(kwargs={"enable_thinking": False}))
    plain = encode_chat(ChatCompletionRequest.model_validate({"messages": messages}), tok)
    assert tok.decode(plain).endswith(A) and plain == encode_prompt(tok, messages)
    with pytest.raises(ValidationError, match="chat_template_kwargs"):
        ChatCompletionRequest.model_validate({**body, "chat_template_kwargs": [1]})
