"""The architecture matrix: tiny random targets of each family a user brings, saved as HF
directories with SmolLM2's tokenizer and chat template, and the checks every served one must
pass (tests/test_target_matrix.py runs them; bench/target_matrix.py writes docs/targets.md).

Windowed families get a sliding window of 8 tokens, shorter than any chat prompt here plus
its generation, so a cache or mask that ignores the window gives other tokens. Every lm_head
is untied, x20, with rows of log-normally spread scales: over a 49k vocabulary, i.i.d. logits
leave ~1% of greedy picks a near tie another code path could flip; spread rows leave ~0.05%.
Every greedy pick compared across two code paths is checked to be no near tie
(floats.assert_tie_free); an architecture whose default seed meets one gets another in SEEDS.

Recurrent targets (gated DeltaNet, KDA, Mamba-2 and hybrids of them) get their recurrent
mixers' output projections scaled x30 (MIXER_SCALE): at random init those layers barely move
the residual stream, and a state that was not rewound after a rejection would then still give
the same greedy tokens. Scaled, committing the wrong state changes the output
(tests/test_recurrent_rewind.py shows it does).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

WINDOW = 8
NEW_TOKENS = 16
SEEDS = {"llama": 1, "deepseek-v3": 1}  # arch -> a seed whose greedy picks here are no near ties
MIXER_SCALE = 30.0  # recurrent mixers' out_proj, so their state decides tokens
# Gemma-2 soft-caps its logits at 30: larger raw logits would all saturate into near ties.
HEAD_SCALE = {"gemma2": 2.0}
CHAT = [{"role": "user", "content": "Tell me about the weather at the coast in spring, please."}]


def _common(vocab: int, bos: int, eos: int) -> dict:
    return dict(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=False, bos_token_id=bos,
                eos_token_id=eos, pad_token_id=eos)


def _gemma3_text(c: dict) -> dict:
    return dict(c, head_dim=8, sliding_window=WINDOW, layer_types=["sliding_attention", "full_attention"] * 2)


def build_config(arch: str, vocab: int, bos: int, eos: int):
    """A tiny config of `arch` (a key of ARCHS)."""
    import transformers as tf

    c = _common(vocab, bos, eos)
    if arch == "llama":
        return tf.LlamaConfig(**c)
    if arch == "qwen2":
        return tf.Qwen2Config(**c)
    if arch == "qwen3":
        return tf.Qwen3Config(**c, head_dim=8)
    if arch == "qwen3-moe":
        return tf.Qwen3MoeConfig(**c, head_dim=8, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)
    if arch == "mistral-window":
        return tf.MistralConfig(**c, sliding_window=WINDOW)
    if arch == "gemma2":
        return tf.Gemma2Config(**c, head_dim=8, sliding_window=WINDOW)  # soft-caps its logits at 30
    if arch == "gemma3-text":
        return tf.Gemma3TextConfig(**_gemma3_text(c))
    if arch == "gemma3-multimodal":  # the 4B+ layout: the text config is nested under a vision tower
        vision = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                      image_size=28, patch_size=14)
        return tf.Gemma3Config(text_config=_gemma3_text(c), vision_config=vision, mm_tokens_per_image=4,
                               eos_token_id=eos, pad_token_id=eos, bos_token_id=bos)
    if arch == "phi3":
        return tf.Phi3Config(**c)
    if arch == "granite":
        return tf.GraniteConfig(**c, logits_scaling=4.0)  # divides its logits
    if arch == "gpt-neox":
        return tf.GPTNeoXConfig(**{k: v for k, v in c.items() if k != "num_key_value_heads"})
    return _recurrent_or_mla(arch, c, tf)


def _recurrent_or_mla(arch: str, c: dict, tf):
    """Hybrid (recurrent + attention), pure recurrent, MLA and attention-sink targets."""
    gdn = dict(head_dim=8, layer_types=["linear_attention", "full_attention"] * 2, linear_num_key_heads=2,
               linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8)
    mla = dict(kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8, num_key_value_heads=4)
    moe = dict(num_experts_per_tok=2, moe_intermediate_size=32)
    mamba = dict(mamba_n_heads=4, mamba_d_head=16, mamba_n_groups=2, mamba_d_state=8, mamba_chunk_size=8)
    kda_layers = ["linear_attention"] * 3 + ["full_attention"]
    if arch == "qwen3-next":  # gated DeltaNet layers among full ones, MoE
        return tf.Qwen3NextConfig(**c, **gdn, num_experts=4, **moe)
    if arch == "qwen3.5":
        return tf.Qwen3_5TextConfig(**c, **gdn)
    if arch == "qwen3.5-moe":  # every MLP an MoE (no dense width: the draft takes the shared expert's)
        return tf.Qwen3_5MoeTextConfig(**{k: v for k, v in c.items() if k != "intermediate_size"}, **gdn,
                                       num_experts=4, shared_expert_intermediate_size=32, **moe)
    if arch == "kimi-linear":  # KDA layers + one MLA layer, MoE with a shared expert
        return tf.KimiLinearConfig(**{**c, **mla}, layer_types=kda_layers, linear_head_dim=8, linear_num_heads=4,
                                   q_lora_rank=None, num_local_experts=4, n_shared_experts=1, **moe)
    if arch == "ling":  # Ling-3.0's family (bailing_hybrid): KDA + MLA + MoE
        return tf.BailingHybridConfig(**{**c, **mla}, layer_types=kda_layers, head_dim=8, q_lora_rank=None,
                                      num_local_experts=4, n_shared_experts=1, first_k_dense_replace=1, n_group=1,
                                      topk_group=1, **moe)
    if arch == "nemotron-h":  # Mamba-2, attention, MoE and MLP blocks, one kind a layer
        d = {k: v for k, v in c.items() if k != "num_hidden_layers"}
        return tf.NemotronHConfig(**d, layers_block_type=["mamba", "attention", "mamba", "moe"], head_dim=8,
                                  mamba_num_heads=4, mamba_head_dim=16, ssm_state_size=8, n_groups=2, chunk_size=8,
                                  n_routed_experts=4, moe_shared_expert_intermediate_size=32, **moe)
    if arch == "falcon-h1":  # attention and Mamba-2 side by side in every layer
        return tf.FalconH1Config(**c, head_dim=8, mamba_d_ssm=64, **mamba)
    if arch == "granite-hybrid":  # Granite-4.0-H: Mamba-2 + attention, MoE
        return tf.GraniteMoeHybridConfig(**c, layer_types=["mamba", "attention"] * 2, num_local_experts=4,
                                         shared_intermediate_size=32, num_experts_per_tok=2, **mamba)
    if arch == "mamba2":  # purely recurrent: no attention layer at all
        return tf.Mamba2Config(vocab_size=c["vocab_size"], hidden_size=32, num_hidden_layers=4, num_heads=4,
                               head_dim=16, state_size=8, n_groups=2, chunk_size=8, expand=2, tie_word_embeddings=False,
                               bos_token_id=c["bos_token_id"], eos_token_id=c["eos_token_id"],
                               pad_token_id=c["pad_token_id"])
    if arch == "deepseek-v3":  # MLA, MoE after one dense layer
        return tf.DeepseekV3Config(**{**c, **mla}, q_lora_rank=24, n_routed_experts=4, n_shared_experts=1,
                                   first_k_dense_replace=1, n_group=1, topk_group=1, **moe)
    if arch == "gpt-oss":  # attention sinks, sliding and full layers, MoE
        return tf.GptOssConfig(**c, head_dim=8, num_local_experts=4, num_experts_per_tok=2, sliding_window=WINDOW,
                               layer_types=["sliding_attention", "full_attention"] * 2)
    if arch == "lfm2":  # short-convolution layers: refused
        return tf.Lfm2Config(**c, layer_types=["conv", "full_attention"] * 2, architectures=["Lfm2ForCausalLM"])
    raise KeyError(arch)


DENSE = ("llama", "qwen2", "qwen3", "qwen3-moe", "mistral-window", "gemma2", "gemma3-text", "gemma3-multimodal",
         "phi3", "granite", "gpt-neox")
RECURRENT = ("qwen3-next", "qwen3.5", "qwen3.5-moe", "kimi-linear", "ling", "nemotron-h", "falcon-h1", "granite-hybrid",
             "mamba2")
SERVED = DENSE + RECURRENT + ("deepseek-v3", "gpt-oss")
REFUSED = ("lfm2",)
ARCHS = SERVED + REFUSED


def save_tiny(arch: str, out: Path, seed: int = 0) -> Path:
    """A tiny random `arch` target saved at `out` with SmolLM2's tokenizer; a refused
    architecture gets its config.json only (it must be refused before any weight is read)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from splitserve.assets import smollm2_dir

    tok = AutoTokenizer.from_pretrained(smollm2_dir())
    cfg = build_config(arch, len(tok), tok.bos_token_id, tok.eos_token_id)
    out.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(out)
    if arch in REFUSED:
        cfg.save_pretrained(out)
        return out
    torch.manual_seed(SEEDS.get(arch, seed))
    model = AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():  # rows of spread scales: the top logit stands out, as in trained models
        head = model.get_output_embeddings().weight  # (V, D)
        head.mul_(HEAD_SCALE.get(arch, 20.0) * torch.exp(torch.randn(head.shape[0], 1)))
        scale_recurrent_mixers(model)
    model.save_pretrained(out)
    return out


def scale_recurrent_mixers(model, scale: float = MIXER_SCALE) -> int:
    """Multiply the output projection of every recurrent mixer (a module owning an A_log) by
    `scale`, so that its state decides the greedy tokens -> how many projections were scaled."""
    scaled = 0
    for mod in model.modules():
        if "A_log" in dict(mod.named_parameters(recurse=False)) or "A_log" in dict(
                getattr(mod, "forget_gate", mod).named_parameters(recurse=False)):
            for name, p in mod.named_parameters():
                if name in ("out_proj.weight", "o_proj.weight"):
                    p.mul_(scale)
                    scaled += 1
    return scaled


@dataclass
class Row:
    """One architecture's results: True passed, False failed, None not applicable."""

    arch: str
    model_class: str
    windows: str
    logits: str
    train: bool | None = None
    exact: bool | None = None
    export: bool | None = None
    serve_equal: bool | None = None
    t1_logits: bool | None = None
    grouped_capture: bool | None = None
    refused: str | None = None


def run_config(target_dir: Path, run_dir: Path, arch: str):
    from splitserve.config import DataConfig, DraftConfig, EvalConfig, RunConfig, TargetConfig, TrainConfig

    return RunConfig(
        target=TargetConfig(name=arch, path=str(target_dir), device="cpu", layer_ids=[0, 1, 2]),
        draft=DraftConfig(block_size=4, num_layers=1, markov_rank=8),
        data=DataConfig(max_length=64, max_samples=8),
        train=TrainConfig(max_steps=3, batch_size=2, anchors_per_seq=4, warmup_steps=0, log_every=3, save_every=3,
                          device="cpu", lr=3e-3),
        eval=EvalConfig(num_prompts=2, max_new_tokens=NEW_TOKENS, compare_untrained=False, calibrate=False),
        run_dir=str(run_dir),
    )


def chat_ids(tokenizer) -> list[int]:
    ids = tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)


def assert_no_near_ties(target, prompt: list[int], tokens: list[int]) -> None:
    """Each greedy pick of `tokens` after `prompt` wins by more than float32 drift, so two code
    paths (chunked rounds vs one token a step, static vs dynamic cache) cannot flip it."""
    from floats import assert_tie_free

    with torch.no_grad():
        logits = target.model(torch.tensor([prompt + tokens])).logits[0].float()  # (P+N, V)
    assert_tie_free(logits[len(prompt) - 1 : len(prompt) + len(tokens) - 1], "greedy continuation")


def logits_match(target, ids: list[int]) -> bool:
    """The logits speculative verification samples from (cached and static paths) equal the
    architecture's own forward logits, soft-capping and scaling included."""
    from floats import assert_float32_close

    x = torch.tensor([ids])
    with torch.no_grad():
        want = target.model(x).logits[0].float()  # (T, V)
    got_cached, _ = target.forward_cached(x, target.new_cache())
    cache = target.new_static_cache(len(ids) + 4)
    got_static, _ = target.forward_static(x, cache, torch.arange(len(ids)))
    assert_float32_close(got_cached[0], want)
    assert_float32_close(got_static[0], want)
    return True


def check_served(arch: str, work: Path) -> Row:
    """Train a few steps, evaluate exactness on held-out prompts, export and reload, and compare
    the serving engine with transformers' greedy `generate` on a chat prompt."""
    from floats import assert_float32_close

    from splitserve.config import EngineConfig, ModelsConfig
    from splitserve.evaluation.evaluate import evaluate
    from splitserve.evaluation.heldout import load_prompt_ids
    from splitserve.export import export_draft
    from splitserve.loading import load_draft, load_models
    from splitserve.speculative.engine import Engine, SamplingParams
    from splitserve.target.eos import eos_ids
    from splitserve.train.loop import train

    target_dir = save_tiny(arch, work / "target")
    cfg = run_config(target_dir, work / "run", arch)
    result = train(cfg)
    target, draft = result.target, result.draft
    row = Row(arch, type(target.model).__name__, _windows(target), _transform(target))
    row.train = result.state.step == cfg.train.max_steps
    row.grouped_capture = grouped_capture_matches(target)

    prompts = load_prompt_ids("chitchat", target.tokenizer, cfg.eval.num_prompts)
    report = evaluate(target, draft, prompts, NEW_TOKENS, eos_ids=eos_ids(target))
    for p, r in zip(prompts, report.results):
        assert_no_near_ties(target, p, r.tokens)
    row.exact = report.exact_matches == len(prompts)

    out = export_draft(draft, work / "export", target.info)
    reloaded = load_draft(out, target)
    block = torch.tensor([prompts[0][:4]])
    with torch.no_grad():
        pos = torch.arange(4)[None]
        aux = target.capture(torch.tensor([prompts[0]])).aux
        ctx_a, ctx_b = draft.context_kv(aux, torch.arange(aux.shape[1])[None]), reloaded.context_kv(
            aux, torch.arange(aux.shape[1])[None])
        h_a = draft.backbone(draft.block_inputs(block[:, 0]), pos + aux.shape[1], ctx_a, None)
        h_b = reloaded.backbone(reloaded.block_inputs(block[:, 0]), pos + aux.shape[1], ctx_b, None)
        assert_float32_close(reloaded.logits(h_b, block), draft.logits(h_a, block))
    row.export = all(torch.equal(v, reloaded.state_dict()[k]) for k, v in draft.state_dict().items())

    served_target, served_draft = load_models(ModelsConfig(draft=str(out), target=str(target_dir), device="cpu",
                                                           dtype="float32"))
    ids = chat_ids(served_target.tokenizer)
    eos = eos_ids(served_target)
    engine = Engine(served_target, served_draft, EngineConfig(max_context=len(ids) + NEW_TOKENS + 8))
    got = engine.generate(ids, SamplingParams(max_tokens=NEW_TOKENS, eos_ids=eos)).tokens
    x = torch.tensor([ids])
    with torch.no_grad():
        gen = served_target.model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=NEW_TOKENS,
                                           do_sample=False)[0, len(ids):].tolist()
    want = next((gen[: i + 1] for i, t in enumerate(gen) if t in eos), gen)
    assert_no_near_ties(served_target, ids, want)
    row.serve_equal = got == want
    row.t1_logits = logits_match(served_target, ids)
    return row


def grouped_capture_matches(target) -> bool:
    """Samples captured together in their length buckets (target/bucketed.py, the capture
    training uses on a GPU) give each sample's own unpadded capture: right padding and the
    other rows of the forward reach none of a sample's positions, windows and caps included."""
    from floats import assert_float32_close
    from tiny import random_samples

    from splitserve.stream.sources import TargetSource

    samples = random_samples((3, 9, 17, 30, 64, 70), target.info.vocab_size)
    order = list(range(len(samples)))
    plain = TargetSource(target, samples).get(order)
    grouped = TargetSource(target, samples, bucketed=True, group_tokens=256).get(order)
    try:
        for a, b in zip(plain, grouped):
            assert_float32_close(b.aux, a.aux)
            assert_float32_close(b.final, a.final)
    except AssertionError:
        return False
    return True


def check_refused(arch: str, work: Path) -> Row:
    """A refused architecture fails at start, from its config alone (no weights are saved)."""
    from splitserve.config import TargetConfig
    from splitserve.target.arch import UnsupportedTargetError
    from splitserve.target.hf import load_hf_target

    target_dir = save_tiny(arch, work / "target")
    cfg = json.loads((target_dir / "config.json").read_text())
    row = Row(arch, (cfg.get("architectures") or ["?"])[0], "-", "-")
    try:
        load_hf_target(TargetConfig(name=arch, path=str(target_dir), device="cpu"))
    except UnsupportedTargetError as exc:
        row.refused = str(exc)
    return row


def _windows(target) -> str:
    """Per layer: full, sw<window>, rec (a recurrent state: linear attention, Mamba-2), rec+full
    (Falcon-H1: both in one layer) or mlp (no mixer: Nemotron-H's MLP/MoE blocks)."""
    layout = target.layout
    ws, rec = layout.windows, layout.recurrent or (False,) * len(layout.windows)
    if not any(w is not None for w in ws) and not any(rec):
        return "full"
    kinds = layout.layer_types or ("",) * len(ws)
    return " ".join("rec+full" if k == "hybrid" else "rec" if r else "mlp" if k in ("mlp", "moe")
                    else "full" if w is None else f"sw{w}" for w, r, k in zip(ws, rec, kinds))


def _transform(target) -> str:
    t = target.logit_transform
    parts = []
    if t.multiplier != 1.0:
        parts.append(f"x{t.multiplier:g}")
    if t.divisor != 1.0:
        parts.append(f"/{t.divisor:g}")
    if t.softcap is not None:
        parts.append(f"softcap {t.softcap:g}")
    return ", ".join(parts) or "raw"


def _mark(v: bool | None) -> str:
    return {True: "yes", False: "**NO**", None: "-"}[v]


def markdown(rows: list[Row]) -> str:
    head = ("| architecture | class | layer windows | logits | train | greedy exact | export round trip "
            "| serve = generate | T=1 logits | grouped capture |\n|---|---|---|---|---|---|---|---|---|---|\n")
    lines = []
    for r in rows:
        if r.refused is not None or r.arch in REFUSED:
            why = r.refused.split(": ", 1)[-1] if r.refused else "**NOT REFUSED**"  # without the local path
            lines.append(f"| {r.arch} | {r.model_class} | refused at start: {why} | | | | | | | |")
        else:
            lines.append(f"| {r.arch} | {r.model_class} | {r.windows} | {r.logits} | {_mark(r.train)} | "
                         f"{_mark(r.exact)} | {_mark(r.export)} | {_mark(r.serve_equal)} | {_mark(r.t1_logits)} | "
                         f"{_mark(r.grouped_capture)} |")
    return head + "\n".join(lines) + "\n"
