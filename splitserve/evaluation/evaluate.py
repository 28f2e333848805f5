"""Measure a draft against its real target by running speculative decoding on prompts.

τ (acceptance length) = mean tokens committed per round, bonus included = mean(n + 1).
Conditional acceptance at position k = P(n >= k | n >= k-1) over all rounds.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Set as AbstractSet
from dataclasses import asdict, dataclass, field

import torch
from tqdm import tqdm

from splitserve.speculative.decode import SpecDecoder, target_decode
from splitserve.target.backend import DecodingTarget, require_decoding
from splitserve.target.sdpa import varlen_sdpa


@dataclass
class PromptResult:
    prompt_ids: list[int]
    tokens: list[int]
    accepts: list[int]
    exact: bool | None = None  # greedy only: equals the target's own greedy output
    confidences: list[list[float]] | None = None  # per round c_1..c_γ, when recorded (calibration)


@dataclass
class EvalReport:
    tau: float
    per_position: list[float]  # conditional acceptance, k = 1..γ
    rounds: int
    tokens: int
    num_prompts: int
    temperature: float
    block_size: int
    exact_matches: int | None = None
    results: list[PromptResult] = field(default_factory=list)

    def to_dict(self, with_results: bool = True, with_confidences: bool = False) -> dict:
        d = asdict(self)
        if not with_results:
            d.pop("results")
        elif not with_confidences:
            for r in d["results"]:
                r.pop("confidences")
        return d


def acceptance_stats(accepts: list[int], gamma: int) -> tuple[float, list[float]]:
    """accepts: per-round accepted draft tokens n -> (τ, conditional acceptance per position)."""
    if not accepts:
        return 0.0, [0.0] * gamma
    n = torch.tensor(accepts)
    tau = float((n + 1).float().mean())
    per_pos = []
    for k in range(1, gamma + 1):
        reached = int((n >= k - 1).sum())
        per_pos.append(float((n >= k).sum()) / reached if reached else 0.0)
    return tau, per_pos


Decode = Callable[[list[int]], tuple[list[int], list[int], list[list[float]]]]  # ids -> tokens, accepts, confs


def _reference_decoder(target: DecodingTarget, draft, max_new_tokens, temperature, seed, eos_ids,
                       record_confidence) -> Decode:
    """The reference loop (speculative/decode.py), one generator stream across prompts."""
    decoder = SpecDecoder(target, draft)
    gen = torch.Generator(device=target.device).manual_seed(seed)

    def decode(ids: list[int]):
        # The reference loop grows the context every round: a new attention shape each forward.
        with varlen_sdpa():
            res = decoder.generate(ids, max_new_tokens, temperature, eos_ids, gen, record_confidence)
        return res.tokens, res.accepts, res.confidences

    return decode


def _engine_decoder(target: DecodingTarget, draft, max_new_tokens, temperature, seed, eos_ids, record_confidence,
                    max_prompt: int) -> Decode:
    """The serving engine (static caches; CUDA graphs on a GPU), one generator stream across
    prompts. A draft in another dtype than the target's runs as a copy in the target's dtype,
    as it would be served."""
    import copy

    from splitserve.config import EngineConfig
    from splitserve.speculative.engine import Engine, SamplingParams

    if next(draft.parameters()).dtype != target.dtype:
        draft = copy.deepcopy(draft).to(target.dtype)
    cfg = EngineConfig(max_context=max_prompt + max_new_tokens, seed=seed, record_confidence=record_confidence)
    engine = Engine(target, draft, cfg)
    params = SamplingParams(max_new_tokens, temperature, eos_ids=frozenset(eos_ids or ()))

    def decode(ids: list[int]):
        stats = engine.generate(ids, params)
        return stats.tokens, stats.accepts, stats.confidences

    return decode


def evaluate(
    target: DecodingTarget,
    draft,
    prompts: list[list[int]],
    max_new_tokens: int = 64,
    temperature: float = 0.0,
    seed: int = 0,
    check_exact: bool = True,
    eos_ids: AbstractSet[int] | None = None,
    desc: str = "eval",
    record_confidence: bool = False,
    engine: bool = False,
) -> EvalReport:
    """`record_confidence` also keeps the confidence head's c_k of every round (for STS).
    `engine` decodes through the serving engine instead of the reference loop: greedy, the same
    tokens in the same rounds (tests/test_spec_decode.py); at T>0 the same distribution, other
    draws. Exactness is always checked against the target decoding alone (`target_decode`)."""
    require_decoding(target, "evaluation")
    draft.eval()
    args = (target, draft, max_new_tokens, temperature, seed, eos_ids, record_confidence)
    decode = _engine_decoder(*args, max(len(p) for p in prompts)) if engine else _reference_decoder(*args)
    results, all_accepts = [], []
    for ids in tqdm(prompts, desc=desc, unit="prompt", leave=False):
        tokens, accepts, confs = decode(ids)
        exact = None
        if temperature == 0 and check_exact:
            with varlen_sdpa():
                exact = tokens == target_decode(target, ids, max_new_tokens, 0.0, eos_ids)
        results.append(PromptResult(list(ids), tokens, accepts, exact, confs if record_confidence and confs else None))
        all_accepts += accepts
    tau, per_pos = acceptance_stats(all_accepts, draft.arch.block_size)
    exact_matches = sum(bool(r.exact) for r in results) if temperature == 0 and check_exact else None
    return EvalReport(
        tau=tau,
        per_position=per_pos,
        rounds=len(all_accepts),
        tokens=sum(len(r.tokens) for r in results),
        num_prompts=len(prompts),
        temperature=temperature,
        block_size=draft.arch.block_size,
        exact_matches=exact_matches,
        results=results,
    )


def format_reports(named: dict[str, EvalReport]) -> str:
    """A Markdown table: one row per evaluated draft."""
    gamma = max(r.block_size for r in named.values())
    head = "| draft | τ | rounds | tokens | exact | " + " | ".join(f"a{k}" for k in range(1, gamma + 1)) + " |"
    sep = "|" + "---|" * (5 + gamma)
    rows = [head, sep]
    for name, r in named.items():
        exact = "-" if r.exact_matches is None else f"{r.exact_matches}/{r.num_prompts}"
        pos = " | ".join(f"{a:.2f}" for a in r.per_position) + " |" * (gamma - len(r.per_position))
        rows.append(f"| {name} | {r.tau:.3f} | {r.rounds} | {r.tokens} | {exact} | {pos} |")
    return "\n".join(rows)
