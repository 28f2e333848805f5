"""Served acceptance, the engine-neutral part: a draft overfit on one sequence, the draft as an
engine loads it from our export, the K/V an engine keeps for it, and the round loop that an
engine adapter (tests/vllm_layout.py, tests/sglang_layout.py) plugs its own input building into.

The sequence (`reference()`): 37 tokens drawn from four token ids, so every token is followed
by each of the others somewhere. Neither the anchor nor the previously drafted token tells what
comes next (a Markov head's bigram cannot read the sequence off its own drafts): the draft has to
read its context, the target's hidden states at the captured layers, at their positions
relative to the block. A layout that moves the anchor slot, the positions or the captured
layers therefore costs acceptance, where a draft that could read the block off its anchor would
not notice. The target is a tiny random Llama whose layers each move the residual stream a lot
(o_proj and down_proj scaled by LOUD), so that neighbouring layers are different inputs. It
supplies the hidden states the engines capture; the reference sequence plays its greedy choices
(a round accepts the longest drafted prefix that matches it; the next reference token is the
bonus). `loud_hybrid_target` is the same for a hybrid target of tests/arch_matrix.py (gated
DeltaNet, KDA or Mamba-2 layers among attention ones): every projection that writes into its
residual stream is scaled by LOUD, and it captures HYBRID_LAYERS of its four layers.

The draft is trained as tests/test_spec_decode.py's overfit test trains one (draft_loss over
the sequence's captured record), in one thread: a few seconds per head.
Glossary: γ block, D hidden, m captured layers, T tokens, Hkv key/value heads, hd head dim.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from safetensors.torch import load_file
from tiny import VOCAB, tiny_draft, tiny_target

from splitserve.config import LossConfig, TargetConfig
from splitserve.export.names import checkpoint_name
from splitserve.models.dspark import DSparkDraft
from splitserve.records import HiddenRecord
from splitserve.target.hf import decoder_layers, wrap_hf_model
from splitserve.train.step import collate, draft_loss

GAMMA = 4
ROUNDS = 4  # one prefill and three verify rounds
ALPHABET = (20, 40, 60, 80)  # the reference sequence's only tokens
LOUD = 8.0
STEPS = 300
TRAINED_LAYERS = (1, 2, 4)
HYBRID_LAYERS = (1, 2)  # of the hybrid targets' 4 layers (the last one is never captured)
WRITERS = re.compile(r"(o_proj|out_proj|down_proj)(\.weight)?$")  # a layer's writes into the residual stream
VARIANTS = {  # name -> DraftConfig keys (conf/draft/dspark_b16*.yaml's head types, and rank 0)
    "vanilla": dict(markov_rank=8, markov_head_type="vanilla"),
    "gated": dict(markov_rank=8, markov_head_type="gated"),
    "rnn": dict(markov_rank=8, markov_head_type="rnn"),
    "rank0": dict(markov_rank=0),
}


@dataclass(frozen=True)
class Reference:
    prompt: list[int]
    tokens: list[int]  # prompt + continuation

    def accepted(self, drafted: list[int], anchor_pos: int) -> int:
        """How many of a block drafted after the anchor at `anchor_pos` match the sequence."""
        n = 0
        for k, tok in enumerate(drafted):
            if tok != self.tokens[anchor_pos + 1 + k]:
                break
            n += 1
        return n


@functools.lru_cache(maxsize=1)
def reference() -> Reference:
    """A 7-token prompt and room for ROUNDS fully accepted rounds after it, and one more."""
    length = 7 + (ROUNDS + 2) * (GAMMA + 1)
    picks = torch.randint(0, len(ALPHABET), (length,), generator=torch.Generator().manual_seed(0))
    tokens = torch.tensor(ALPHABET)[picks].tolist()
    return Reference(tokens[:7], tokens)


def _loud(target):
    """Scale each layer's writes into the residual stream (attention o_proj, a recurrent mixer's
    out_proj or o_proj, MLP and expert down_proj) by LOUD."""
    with torch.no_grad():
        for name, param in decoder_layers(target.decoder, target.info.num_layers).named_parameters():
            if WRITERS.search(name):
                param.mul_(LOUD)
    return target


@functools.lru_cache(maxsize=None)
def loud_target(layer_ids: tuple[int, ...] = TRAINED_LAYERS):
    return _loud(tiny_target(seed=7, layer_ids=layer_ids))


@functools.lru_cache(maxsize=None)
def loud_hybrid_target(arch: str):
    """tests/arch_matrix.py's tiny `arch` (a key of its ARCHS) at tiny.VOCAB tokens, its lm_head
    x20 as tiny_target's, LOUD, capturing HYBRID_LAYERS."""
    from arch_matrix import build_config
    from transformers import AutoModelForCausalLM

    torch.manual_seed(7)
    model = AutoModelForCausalLM.from_config(build_config(arch, VOCAB, bos=1, eos=2)).eval()
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(20.0)
    return _loud(wrap_hf_model(model, TargetConfig(name=arch, layer_ids=list(HYBRID_LAYERS))))


@functools.lru_cache(maxsize=None)
def overfit(variant: str, arch: str | None = None) -> DSparkDraft:
    """A draft trained on reference() until it drafts every block of it (the tests check that):
    over loud_target()'s hidden states, or loud_hybrid_target(arch)'s."""
    target, ref = (loud_target() if arch is None else loud_hybrid_target(arch)), reference()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: thread hand-offs cost more than the work
    try:
        torch.manual_seed(0)
        draft = tiny_draft(target, block_size=GAMMA, **VARIANTS[variant])
        ids = torch.tensor(ref.tokens)
        loss_mask = torch.zeros(len(ids), dtype=torch.bool)
        loss_mask[len(ref.prompt):] = True
        cap = target.capture(ids[None])
        batch = collate([HiddenRecord(0, ids, loss_mask, cap.aux[0], cap.final[0])], torch.device("cpu"),
                        torch.float32)
        opt = torch.optim.AdamW([p for p in draft.parameters() if p.requires_grad], lr=2e-2)
        schedule = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=2e-2, total_steps=STEPS, pct_start=0.2)
        for step in range(STEPS):
            out, _ = draft_loss(draft, batch, 32, LossConfig(ce_weight=1.0), torch.Generator().manual_seed(step))
            opt.zero_grad()
            out.total.backward()
            opt.step()
            schedule.step()
    finally:
        torch.set_num_threads(threads)
    return draft.eval()


def residual_streams(target, ids: list[int]) -> list[torch.Tensor]:
    """The target's residual stream over `ids`: [the embedding output, then each layer's output],
    each (T, D). What an engine captures is one of these per captured layer."""
    layers = decoder_layers(target.decoder, target.info.num_layers)
    seen: list[torch.Tensor] = []
    hooks = [target.decoder.get_input_embeddings().register_forward_hook(lambda m, i, o: seen.append(o))]
    hooks += [layer.register_forward_hook(lambda m, i, o: seen.append(o[0] if isinstance(o, tuple) else o))
              for layer in layers]
    try:
        with torch.no_grad():
            target.decoder(input_ids=torch.tensor([ids]), use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    return [s[0] for s in seen]


def served_draft(export_dir: Path, trained: DSparkDraft, target) -> DSparkDraft:
    """The draft an engine serves from an export: the exported tensors (read back to float32) by
    their checkpoint names, the captured layers in the ascending order the export writes them,
    and the target's embedding and lm_head. Rank 0 comes back as the zero rank-1 vanilla head the
    export writes; the confidence head is left out (acceptance never reads it)."""
    a = trained.arch
    arch = replace(a, target_layer_ids=tuple(sorted(a.target_layer_ids)), markov_rank=max(a.markov_rank, 1),
                   markov_head_type=a.markov_head_type if a.markov_rank else "vanilla", enable_confidence_head=False)
    draft = DSparkDraft(arch).eval()
    tensors = load_file(str(Path(export_dir) / "model.safetensors"))
    with torch.no_grad():
        for name, param in draft.state_dict().items():
            if not name.startswith(("embed_tokens.", "lm_head.")):
                param.copy_(tensors[checkpoint_name(name)].float())
    draft.load_shared(target.embed_weight(), target.lm_head_weight())
    return draft


class DraftCompute:
    """What an engine's draft model computes, done by our draft's own modules (plain PyTorch):
    the engine's code decides which tensors go in; this decides nothing."""

    def __init__(self, draft: DSparkDraft):
        self.draft = draft

    @torch.no_grad()
    def project(self, aux: torch.Tensor) -> torch.Tensor:
        """aux (T, m*D), captures concatenated in the engine's order -> context features (T, D)."""
        return self.draft.ctx_norm(self.draft.fc(aux.float()))

    @torch.no_grad()
    def context_kv(self, feats: torch.Tensor, positions: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """feats (T, D), positions (T,) -> per draft layer (k, v), each (Hkv, T, hd)."""
        cos, sin = self.draft.rotary(positions.long()[None])
        out = []
        for layer in self.draft.layers:
            k, v = layer.self_attn.project_context(feats[None], cos, sin)
            out.append((k[0], v[0]))
        return out

    @torch.no_grad()
    def block(self, embeds: torch.Tensor, positions: torch.Tensor,
              ctx_kv: list[tuple[torch.Tensor, torch.Tensor]], causal: bool = False) -> torch.Tensor:
        """embeds (Q, D) at positions (Q,), attending to all of ctx_kv (C rows) and to each other,
        or only to earlier rows when `causal` -> final-normed hidden (Q, D)."""
        x = embeds.float()[None]
        cos, sin = self.draft.rotary(positions.long()[None])
        mask = None
        if causal:
            q, c = embeds.shape[0], ctx_kv[0][0].shape[1]
            mask = torch.ones(q, c + q, dtype=torch.bool)
            mask[:, c:] = torch.ones(q, q, dtype=torch.bool).tril()
            mask = mask[None, None]  # (1, 1, Q, C+Q)
        for layer, (k, v) in zip(self.draft.layers, ctx_kv):
            x = layer(x, k[None], v[None], cos, sin, mask)
        return self.draft.norm(x)[0]


class SlotKV:
    """A paged draft K/V cache as the engines address it: slot -> (position, K/V per layer).
    Reading a slot that was never written, or one holding another position, fails: a layout
    that leaves a context row out cannot pass by reading zeros."""

    def __init__(self):
        self.slots: dict[int, tuple[int, list[tuple[torch.Tensor, torch.Tensor]]]] = {}

    def write(self, slots: torch.Tensor, positions: torch.Tensor, kv: list[tuple[torch.Tensor, torch.Tensor]],
              keep: torch.Tensor | None = None) -> None:
        """slots, positions (T,); kv per layer (Hkv, T, hd); keep (T,) bool, or None for all.
        A negative slot is a padding row and writes nothing."""
        for i, (s, p) in enumerate(zip(slots.tolist(), positions.tolist())):
            if s >= 0 and (keep is None or bool(keep[i])):
                self.slots[s] = (p, [(k[:, i], v[:, i]) for k, v in kv])

    def read(self, slots: list[int], positions: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """-> per layer (k, v), each (Hkv, C, hd), in the order given."""
        for s, p in zip(slots, positions):
            assert s in self.slots, f"draft attention read slot {s} (position {p}), which was never written"
            assert self.slots[s][0] == p, f"slot {s} holds position {self.slots[s][0]}, read as {p}"
        per_layer = zip(*[self.slots[s][1] for s in slots])
        return [(torch.stack([k for k, _ in kv], 1), torch.stack([v for _, v in kv], 1)) for kv in per_layer]


def served_accepts(engine, ref: Reference, rounds: int = ROUNDS) -> list[int]:
    """Greedy rounds of `engine` over the reference: -> the accepted draft tokens of each round.

    engine.first_block(prompt, bonus) runs the prefill and drafts the first block;
    engine.next_block(verify_ids, n, bonus) commits a verified block (verify_ids = [anchor, drafts],
    n of the drafts accepted, `bonus` the target's next token) and drafts the next one."""
    p = len(ref.prompt)  # the anchor's position
    bonus = ref.tokens[p]
    drafted = engine.first_block(ref.prompt, bonus)
    accepts = []
    for r in range(rounds):
        assert len(drafted) == GAMMA, drafted
        n = ref.accepted(drafted, p)
        accepts.append(n)
        verify_ids, bonus, p = [bonus] + drafted, ref.tokens[p + 1 + n], p + n + 1
        if r + 1 < rounds:
            drafted = engine.next_block(verify_ids, n, bonus)
    return accepts


def tau(accepts: list[int]) -> float:
    """Mean tokens committed per round: n accepted + 1 bonus. γ+1 when every block is accepted."""
    return sum(n + 1 for n in accepts) / len(accepts)


def check_served_layout(engine, ref: Reference | None = None) -> list[int]:
    """The contract: served by `engine`, the overfit draft accepts every block of its sequence.
    AssertionError, in one line, when it does not: the engine builds the draft's block or context
    otherwise than the trainer did. -> the accepted draft tokens of each round."""
    accepts = served_accepts(engine, ref or reference())
    assert tau(accepts) == GAMMA + 1, (
        f"served tau {tau(accepts):.2f}, not gamma+1 = {GAMMA + 1} (accepted per round: {accepts}): the engine "
        "builds the draft's block or context otherwise than splitserve trains it")
    return accepts
