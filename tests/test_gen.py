"""`splitserve gen` on a tiny random target with SmolLM2's tokenizer: replies are the target's
own continuation, rows are training data with provenance, a resumed run writes the same file as
an uninterrupted one, and bad input is reported by file:line."""

import json

import pytest
import torch
from tiny import GEN_ROWS as ROWS
from tiny import save_sharp_smol

from splitserve.config import TargetConfig
from splitserve.data import DataError, load_samples
from splitserve.data.gen import (
    GenConfig,
    generate_replies,
    plan_turns,
    prepare_model,
    read_sources,
    run_gen,
)
from splitserve.data.prompts import encode_prompt
from splitserve.speculative.decode import target_decode
from splitserve.target.hf import wrap_hf_model


@pytest.fixture(scope="module")
def sharp_smol(tmp_path_factory):
    return save_sharp_smol(tmp_path_factory.mktemp("sharp_smol"), layers=2)


@pytest.fixture
def chat_file(tmp_path):
    path = tmp_path / "chat.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return path


def _cfg(model_dir, data, out, **kw) -> GenConfig:
    # static: batches are fixed slices of the input, which the resume and seeding tests rely on
    kw = {"max_new_tokens": 5, "batch_size": 2, "batching": "static", **kw}
    return GenConfig(data=str(data), out=str(out), target=str(model_dir), **kw)


def test_plan_turns():
    s, u, a = ({"role": r, "content": r[0]} for r in ("system", "user", "assistant"))
    assert plan_turns([s, u, a, u, a, u]) == [[s, u], [u], [u]]
    assert plan_turns([s, a, u, u, a]) == [[s, u, u]]  # a reply to no user turn is dropped
    assert plan_turns([u, a, s]) == [[u]]  # trailing system: nothing to answer
    assert plan_turns([s, a]) == []


def test_greedy_replies_are_the_targets_own_continuation(sharp_smol):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, tok, stop = prepare_model(AutoModelForCausalLM.from_pretrained(sharp_smol),
                                     AutoTokenizer.from_pretrained(sharp_smol))
    prompts = [encode_prompt(tok, p) for p in ("Hi", "Tell me a long story about a dragon and a knight", "Why?")]
    assert len({len(p) for p in prompts}) == 3  # left padding is exercised
    target = wrap_hf_model(model, TargetConfig(name="sharp", layer_ids=[0]))
    free = [target_decode(target, p, 8) for p in prompts]
    # An end-of-turn id the first continuation reaches at step 4, to check stopping per row.
    for stop_ids in (stop, {free[0][3]}):
        replies = generate_replies(model, tok, prompts, GenConfig(max_new_tokens=8), stop_ids)
        for p, r in zip(prompts, replies):
            ref = target_decode(target, p, 8, eos_ids=stop_ids)
            finished = ref[-1] in stop_ids
            assert r.token_ids == (ref[:-1] if finished else ref) and r.finished == finished
            assert r.text == tok.decode(r.token_ids, skip_special_tokens=True)
    assert replies[0].finished and len(replies[0].token_ids) == 3


def test_rows_are_training_data_with_provenance(sharp_smol, chat_file, tmp_path):
    out = tmp_path / "gen.jsonl"
    summary = run_gen(_cfg(sharp_smol, chat_file, out, seed=7), progress=False)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert summary.written == len(rows) == 5 and summary.turns == 6 and summary.new_tokens == 30
    assert "5 written" in summary.format()

    ids = [r["gen"]["source_row"] for r in rows]
    assert ids[2] == "conv-3" and ids[0].startswith("sha1:") and ids[4] == ids[0] + "#2"
    assert [r["gen"]["source_line"] for r in rows] == [1, 2, 3, 4, 5]
    g = rows[2]["gen"]
    assert g["target"] == sharp_smol.name and g["target_path"] == str(sharp_smol) and g["data"] == str(chat_file)
    assert (g["temperature"], g["top_p"], g["top_k"], g["seed"], g["max_new_tokens"]) == (0.0, 1.0, 0, 7, 5)
    assert g["turns"] == 2 and g["new_tokens"] == 10

    # The prompt side is kept, every assistant turn is new.
    roles = [[m["role"] for m in r["messages"]] for r in rows]
    assert roles[2] == ["system", "user", "assistant", "user", "assistant"]
    assert roles[3] == ["system", "user", "assistant"]
    assert rows[2]["messages"][3]["content"] == "And at sunset?"
    assert all(m["content"] not in ("Paris.", "Cheerful.", "Scattering.") for r in rows for m in r["messages"])

    from transformers import AutoTokenizer

    samples, stats = load_samples(out, AutoTokenizer.from_pretrained(sharp_smol), max_length=512)
    assert stats.samples == 5 and all(sum(s.loss_mask) >= 5 for s in samples)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_resume_writes_the_same_file_as_an_uninterrupted_run(sharp_smol, chat_file, tmp_path, monkeypatch,
                                                             temperature):
    from splitserve.data import gen

    kw = {"temperature": temperature, "top_k": 40, "top_p": 0.9, "seed": 3}
    whole = tmp_path / "whole.jsonl"
    run_gen(_cfg(sharp_smol, chat_file, whole, **kw), progress=False)

    resumed = tmp_path / "resumed.jsonl"
    real, calls = gen.regenerate, []

    def stops_in_the_second_batch(*a, **k):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(gen, "regenerate", stops_in_the_second_batch)
    with pytest.raises(KeyboardInterrupt):
        run_gen(_cfg(sharp_smol, chat_file, resumed, **kw), progress=False)
    monkeypatch.setattr(gen, "regenerate", real)
    assert len(resumed.read_text().splitlines()) == 2
    with open(resumed, "a") as f:
        f.write('{"messages": [{"role": "user", "con')  # a write torn by the stop

    summary = run_gen(_cfg(sharp_smol, chat_file, resumed, **kw), progress=False)
    assert (summary.already_done, summary.written) == (2, 3)
    # bit-equal: batches are fixed slices of the input, each seeded by its index, so a resumed
    # batch replays the same ops and draws
    assert resumed.read_bytes() == whole.read_bytes()
    again = run_gen(_cfg(sharp_smol, chat_file, resumed, **kw), progress=False)
    assert (again.already_done, again.written) == (5, 0)


def test_sampling_is_seeded_and_resume_refuses_other_settings(sharp_smol, chat_file, tmp_path):
    outs = []
    for i, seed in enumerate((1, 1, 2)):
        out = tmp_path / f"s{i}.jsonl"
        run_gen(_cfg(sharp_smol, chat_file, out, temperature=1.0, seed=seed, max_rows=2), progress=False)
        outs.append([r["messages"] for r in map(json.loads, out.read_text().splitlines())])
    assert outs[0] == outs[1] and outs[0] != outs[2]  # bit-equal: the same ops and draws twice
    with pytest.raises(DataError, match="temperature=1.0, this run has temperature=0.0"):
        run_gen(_cfg(sharp_smol, chat_file, tmp_path / "s0.jsonl", seed=1), progress=False)


def test_max_turns_and_max_length(sharp_smol, chat_file, tmp_path):
    one = run_gen(_cfg(sharp_smol, chat_file, tmp_path / "one.jsonl", max_turns=1), progress=False)
    assert one.turns == 5
    # First prompts are 37, 37, 23, 26, 37 tokens long; conv-3's second prompt is longer than 30,
    # so it stops after one reply and drops the unanswered user turn.
    short = tmp_path / "short.jsonl"
    cut = run_gen(_cfg(sharp_smol, chat_file, short, max_length=30), progress=False)
    assert (cut.written, cut.too_long, cut.turns) == (2, 3, 2)
    conv3 = json.loads(short.read_text().splitlines()[0])
    assert conv3["gen"]["source_row"] == "conv-3"
    assert [m["role"] for m in conv3["messages"]][-2:] == ["user", "assistant"]
    assert len(conv3["messages"]) == 3


def test_continuous_batching_gives_the_static_rows_and_resumes(sharp_smol, chat_file, tmp_path, monkeypatch):
    """A finished conversation frees its slot at once; greedy rows are the static path's (in
    completion order), and a run stopped after its first row resumes to the same set."""
    from splitserve.data import gen

    static = run_gen(_cfg(sharp_smol, chat_file, tmp_path / "static.jsonl", max_new_tokens=8), progress=False)

    def rows(path):
        return {r["gen"]["source_row"]: r["messages"] for r in map(json.loads, path.read_text().splitlines())}

    out = tmp_path / "cont.jsonl"
    real = gen.regenerate_continuous

    def stop_after_first_row(model, tok, sources, cfg, stop, on_row, **kw):
        def once(*row):
            on_row(*row)
            raise KeyboardInterrupt
        return real(model, tok, sources, cfg, stop, once, **kw)

    monkeypatch.setattr(gen, "regenerate_continuous", stop_after_first_row)
    with pytest.raises(KeyboardInterrupt):
        run_gen(_cfg(sharp_smol, chat_file, out, max_new_tokens=8, batching="continuous"), progress=False)
    assert len(out.read_text().splitlines()) == 1
    monkeypatch.setattr(gen, "regenerate_continuous", real)
    cont = run_gen(_cfg(sharp_smol, chat_file, out, max_new_tokens=8, batching="continuous", batch_size=3),
                   progress=False)
    assert (cont.already_done, cont.written) == (1, 4)
    assert rows(out) == rows(tmp_path / "static.jsonl") and static.written == 5


def test_bad_rows_name_file_and_line(tmp_path, capsys):
    from splitserve.cli import main

    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(ROWS[0]) + "\n\n{not json\n")
    with pytest.raises(DataError, match=f"{bad}:3: malformed JSON"):
        read_sources(bad)
    bad.write_text(json.dumps({"messages": [{"role": "bot", "content": "hi"}]}) + "\n")
    with pytest.raises(SystemExit, match=f"splitserve gen: {bad}:1: messages\\[0\\] has unknown role"):
        main(["gen", "--data", str(bad), "--out", str(tmp_path / "o.jsonl")])


def test_cli(sharp_smol, chat_file, tmp_path, capsys):
    from splitserve.cli import main

    out = tmp_path / "cli.jsonl"
    main(["gen", "--data", str(chat_file), "--out", str(out), "--target", str(sharp_smol),
          "--max-new-tokens", "3", "--max-rows", "2", "--temperature", "0.7", "--top-k", "5", "--seed", "9"])
    text = capsys.readouterr().out
    assert "rows    2 written" in text and "T=0.7 top_p=1.0 top_k=5 seed=9" in text
    assert [json.loads(line)["gen"]["top_k"] for line in out.read_text().splitlines()] == [5, 5]
    with pytest.raises(SystemExit):
        main(["gen", "--out", str(out), "--top-p", "0"])
    assert "0 < top_p <= 1" in capsys.readouterr().err


@pytest.mark.parametrize("batching", ["static", "continuous"])
def test_chat_template_file_and_kwargs_reach_every_prompt(sharp_smol, chat_file, tmp_path, monkeypatch, batching):
    """In-process gen renders every prompt with --chat-template and --chat-template-kwargs, as the
    remote path sends the kwargs to the servers (test_gen_remote.py), and records both."""
    from templates import QWEN3_STYLE

    import splitserve.data.gen as gen_mod
    import splitserve.data.gen_continuous as cont_mod

    (tmp_path / "q3.jinja").write_text(QWEN3_STYLE)
    seen = []

    def spy(tokenizer, prompt, chat=None):
        seen.append(chat)
        return encode_prompt(tokenizer, prompt, chat)

    monkeypatch.setattr(gen_mod, "encode_prompt", spy)
    monkeypatch.setattr(cont_mod, "encode_prompt", spy)
    out = tmp_path / "out.jsonl"
    kwargs = {"enable_thinking": False}
    summary = run_gen(_cfg(sharp_smol, chat_file, out, max_rows=3, batching=batching,
                           chat_template=str(tmp_path / "q3.jinja"), chat_template_kwargs=kwargs), progress=False)
    assert summary.written == 3 and seen
    assert all(c.template == QWEN3_STYLE and c.kwargs == kwargs for c in seen)
    gen = json.loads(out.read_text().splitlines()[0])["gen"]
    assert gen["chat_template"] == str(tmp_path / "q3.jinja") and gen["chat_template_kwargs"] == kwargs


def test_cpu_paged_cache_holds_the_run_not_the_machine(tmp_path):
    """On a CPU, transformers would size the paged cache from free RAM (most of the machine); gen
    asks for batch_size conversations at their longest instead, and leaves a GPU's sizing alone."""
    from splitserve.data.gen_continuous import cache_config

    cfg = _cfg(tmp_path, tmp_path / "d.jsonl", tmp_path / "o.jsonl", batch_size=3, max_new_tokens=100, max_length=600)
    cb = cache_config(cfg, torch.device("cpu"), page_size=256)
    assert cb.num_blocks == 3 * 3 and cb.page_size == 256  # 700 tokens = 3 pages, for each of 3 conversations
    assert cb.max_batch_tokens == 2100
    assert cache_config(cfg, torch.device("cuda", 0)) is None
