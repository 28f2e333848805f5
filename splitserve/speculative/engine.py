"""The batch-1 serving engine: speculative decoding with static shapes, and its AR baseline.

Device state between rounds, for committed tokens x_0 .. x_p (p = `seq_len`):
    target cache   StaticKVCache, slots 0..p-1 committed, slots >= p stale or empty
    drafter        the draft family's state (speculative/drafter.py): DSpark's StaticDraftContext,
                   slots 0..p-1 committed (the target's captures there); EAGLE-3's own KV cache
    anchor ()      x_p, the last target output, in neither cache yet
    seq_len ()     p
    out (γ+2,)     [n, committed tokens of the last round, padding]
One speculative round (`_spec_round`) touches only these buffers and every shape in it is fixed
by γ and the attention window W (the first W slots of both caches; W covers p+γ), so it is
captured as one CUDA graph per window:
    1. draft   d_1..d_γ (`drafter.propose`; DSpark: from [x_p, M, ..., M] at p..p+γ-1, context
               slots < p visible; EAGLE-3: a chain of γ steps)
    2. verify  target on [x_p, d_1..d_γ] at p..p+γ (writes γ+1 cache slots)
    3. accept  n draft tokens + bonus (greedy or rejection sampling, on the device)
    4. commit  the drafter told what was committed (`drafter.commit`: all γ+1 captures and the
               committed tokens; DSpark writes its context at p..p+γ, slots > p+n stay hidden),
               seq_len += n + 1, anchor = bonus, out = [n, d_1..d_n, bonus, ...]
Rejected tokens are never cropped: the next round starts at the new p, whose masks hide every
slot at or above it until it is overwritten. The host reads `out` once per round (the tokens to
stream, which also tell it p, hence the next round's window) and decides whether to stop;
nothing else leaves the device. On CUDA the host does not wait for that read to launch: while
round k runs, round k+1 is already queued (it reads p and the anchor from the device, and takes
the window of the furthest p it can start at), so the GPU goes from round to round without a
gap for Python (speculative/host_reads.py). A round queued past the request's end (EOS, cancel)
runs for nothing and is never read.

Recurrent layers (hybrid targets: gated DeltaNet, KDA, Mamba-2) cannot be rewound by a mask. The
verify forward reads their state without advancing it, and after the host reads n the accepted
prefix is committed by replaying it through the recurrent mixers (`commit_static`, one CUDA
graph per prefix length; target/recurrent.py). That read comes before the next round, so on
such targets a round is not queued ahead of the previous one's read.

AR mode is the same engine without the draft: one token per step through the same static cache.
Verification width is static (γ+1). With `verify_schedule="confidence"` the round also picks,
on the device, a prefix length L from the draft's calibrated c_k (speculative/schedule.py) and treats
d_{L+1}.. as rejected: accepted = min(n, L), the next token drawn from q_L when all of d_1..d_L
passed. The verify forward keeps its width γ+1 (one CUDA graph), so this saves no target compute
yet: it is the lossless selection, and the seam where one graph per width would be selected.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import torch

from splitserve.config import EngineConfig
from splitserve.models.build import check_compatible
from splitserve.models.dspark import DSparkDraft
from splitserve.models.eagle3 import Eagle3Draft
from splitserve.speculative import verify_kernel as verify_kernels
from splitserve.speculative import verify as verify_reference
from splitserve.speculative.decode import nonfinite, nonfinite_error, pick_token
from splitserve.speculative.draft_weights import served_draft
from splitserve.speculative.drafter import engine_drafter
from splitserve.speculative.host_reads import HostReads
from splitserve.speculative.schedule import SCHEDULES, choose_prefix, linear_cost, prefix_survival, truncate_verify
from splitserve.speculative.verify import verify_block
from splitserve.target.backend import DecodingTarget, require_decoding
from splitserve.target.graphs import StepGraphs
from splitserve.target.native.target import native_target
from splitserve.target.native.attention_kernel import decode_attention

MODES = ("spec", "ar")


def attention_windows(min_window: int, capacity: int) -> list[int]:
    """min_window, 2*min_window, ... below capacity, then capacity; [capacity] when off (0)."""
    if min_window < 0:
        raise ValueError(f"min_window must be >= 0, got {min_window}")
    out = []
    w = min_window
    while 0 < w < capacity:
        out.append(w)
        w *= 2
    return out + [capacity]


# Temperatures below this decode greedily, as vLLM's do (its sampling epsilon): logits divided by
# a subnormal temperature overflow to inf, and at 1e-5 sampling is greedy up to exact ties anyway.
GREEDY_BELOW = 1e-5


class ContextLengthError(ValueError):
    """A request that does not fit the engine's context."""


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int
    temperature: float = 0.0
    seed: int | None = None
    eos_ids: frozenset[int] = frozenset()  # empty: ignore EOS (fixed output length)
    top_k: int = 0  # T>0: sample from the k most likely tokens (0: all); speculative/verify.py truncate_probs
    top_p: float = 1.0  # T>0: then from the smallest set holding this much mass (1: all)


@dataclass
class GenStats:
    prompt_tokens: int
    tokens: list[int] = field(default_factory=list)  # generated ids (EOS included when hit)
    accepts: list[int] = field(default_factory=list)  # per round: accepted draft tokens n
    # per round c_1..c_γ, when EngineConfig.record_confidence and the draft has a confidence head
    confidences: list[list[float]] = field(default_factory=list)
    finish_reason: str = "length"  # stop (EOS) | length | cancelled
    ttft_s: float = 0.0  # request start -> first token on the host
    token_times: list[float] = field(default_factory=list)  # seconds since start, per generated token
    total_s: float = 0.0

    @property
    def accept_length(self) -> float:
        """τ: tokens committed per target forward after the prefill, bonus included."""
        return sum(n + 1 for n in self.accepts) / len(self.accepts) if self.accepts else 0.0

    @property
    def tpot_s(self) -> float | None:
        """Mean time per output token after the first (TTFT excluded)."""
        if len(self.token_times) < 2:
            return None
        return (self.token_times[-1] - self.token_times[0]) / (len(self.token_times) - 1)


OnTokens = Callable[[list[int]], bool]  # new committed tokens -> keep going?


class Engine:
    def __init__(self, target: DecodingTarget, draft: DSparkDraft | Eagle3Draft | None,
                 cfg: EngineConfig | None = None):
        self.cfg = cfg = cfg or EngineConfig()
        target = native_target(require_decoding(target, "the serving engine"), cfg.decoder, cfg.weight_format,
                               cfg.native_products)
        if draft is not None:  # a draft made for another target: one line, before any state is built
            check_compatible(draft.arch, target.info, where="the draft")
        draft = served_draft(draft, cfg.draft_weight_format)  # an FP8 copy, or the draft itself
        self.target, self.draft = target, draft
        self.device = target.device
        max_pos = target.max_positions
        self.max_context = min(cfg.max_context, max_pos) if max_pos else cfg.max_context
        self.gamma = draft.arch.block_size if draft is not None else 0
        # γ+1 spare slots: a round at p <= max_context-1 writes up to p+γ.
        self.capacity = self.max_context + self.gamma + 1
        self.cache = target.new_static_cache(self.capacity)
        dev = self.device
        self.seq_len = torch.zeros((), dtype=torch.long, device=dev)
        self.anchor = torch.zeros((), dtype=torch.long, device=dev)
        # one step's result, read by the host: [n, committed tokens (γ+1), logits not finite]
        self.out = torch.zeros(self.gamma + 3, dtype=torch.long, device=dev)
        self._offsets = torch.arange(self.gamma + 1, device=dev)  # (γ+1,)
        recording = cfg.record_confidence and draft is not None and draft.confidence is not None
        self.conf_out = torch.zeros(self.gamma, dtype=torch.float32, device=dev) if recording else None  # (γ,)
        self.generator = torch.Generator(device=dev).manual_seed(cfg.seed)
        self.windows = attention_windows(cfg.min_window, self.capacity)
        # Queue the next step before reading this one (speculative/host_reads.py): on CUDA by
        # default, where launches are asynchronous; on a CPU it would only add a wasted step.
        self._overlap = cfg.overlap_steps if cfg.overlap_steps is not None else dev.type == "cuda"
        self._recurrent = bool(target.recurrent)  # spec rounds then need a commit after each read
        self._reads = HostReads(dev)
        # one graph per (mode, temperature, window), room for a few temperatures per mode, and
        # on recurrent targets one commit graph per accepted-prefix length 1..γ+1
        self.graphs = StepGraphs(cfg.use_cuda_graphs, dev, self.generator,
                                 max_graphs=8 * len(self.windows) + (self.gamma + 1) * self._recurrent,
                                 source=target)
        if cfg.markov_topk < 0:
            raise ValueError(f"markov_topk must be >= 0 (0: the exact Markov stage), got {cfg.markov_topk}")
        if cfg.verify_kernel not in ("auto", "torch"):
            raise ValueError(f"verify_kernel must be auto or torch, got {cfg.verify_kernel!r}")
        if cfg.draft_attention not in ("kernel", "sdpa"):
            raise ValueError(f"draft_attention must be kernel or sdpa, got {cfg.draft_attention!r}")
        self._draft_attend = decode_attention if cfg.draft_attention == "kernel" else None
        self.drafter = None
        if draft is not None:
            self.drafter = engine_drafter(draft, self.capacity, dev, self._draft_attend, cfg.markov_topk,
                                          cfg.markov_kernel)
        impl = verify_kernels if cfg.verify_kernel == "auto" else verify_reference
        self._verify_fns = {"greedy": impl.greedy_verify, "sampling": impl.sampling_verify}
        self._init_schedule(cfg)
        if cfg.compile_backend:
            # Fixed shapes, so no dynamic-shape tracing. Sampling with a user generator breaks
            # the traced graph around the draw, which then runs eagerly (still graph-captured).
            # One trace per (temperature, window) met; past dynamo's recompile limit (8 by default)
            # a step would silently run uncompiled. (The setting's name before torch 2.7 differs.)
            dyn = torch._dynamo.config
            name = "recompile_limit" if hasattr(dyn, "recompile_limit") else "cache_size_limit"
            setattr(dyn, name, max(getattr(dyn, name), self.graphs.max_graphs))
            self._spec_round = torch.compile(self._spec_round, backend=cfg.compile_backend, dynamic=False)
            self._ar_step = torch.compile(self._ar_step, backend=cfg.compile_backend, dynamic=False)

    def _init_schedule(self, cfg: EngineConfig) -> None:
        if cfg.verify_schedule not in SCHEDULES:
            raise ValueError(f"verify_schedule must be one of {SCHEDULES}, got {cfg.verify_schedule!r}")
        self.scheduled = cfg.verify_schedule == "confidence" and self.draft is not None
        self.verify_len = torch.full((), self.gamma, dtype=torch.long, device=self.device)  # (): L of the last round
        if not self.scheduled:
            return
        if self.draft.confidence is None:
            raise ValueError("verify_schedule='confidence' needs a draft with a confidence head")
        cost = cfg.verify_cost if cfg.verify_cost is not None else linear_cost(self.gamma, cfg.verify_cost_beta)
        if len(cost) != self.gamma + 1 or min(cost) <= 0:
            raise ValueError(f"verify_cost needs γ+1 = {self.gamma + 1} positive values, got {cost}")
        self._cost = torch.tensor(cost, dtype=torch.float32, device=self.device)  # (γ+1,)
        temps = getattr(self.draft, "confidence_temperatures", None)  # STS, when the draft carries a fit
        if temps is not None and len(temps) != self.gamma:
            raise ValueError(f"the draft's confidence_temperatures has {len(temps)} values, γ is {self.gamma}")
        self._conf_temps = None if temps is None else torch.tensor(temps, dtype=torch.float32, device=self.device)

    # ---- fixed-shape steps (graph-capturable: no host sync, device buffers only) -------------

    def _spec_round(self, temperature: float, window: int, trunc: tuple[int, float] = (0, 1.0)) -> None:
        p = self.seq_len  # (); p + γ < window
        d_tok, d_prob, conf = self._draft_block(temperature, window)  # (γ,), (γ, V) | None, (γ,) | None
        pos = p + self._offsets  # (γ+1,)
        verify_in = torch.cat([self.anchor.view(1), d_tok])  # (γ+1,): x_p, d_1..d_γ
        logits, cap = self.target.forward_static(verify_in[None], self.cache, pos, window=window,
                                                 verify=True)  # (1, γ+1, V)
        top_k, top_p = trunc  # the draft proposes untruncated; verify_block's maths keeps it lossless
        n, bonus = verify_block(d_tok, d_prob, logits[0], temperature, self.generator, **self._verify_fns,
                                top_k=top_k, top_p=top_p)
        if self.scheduled:
            limit = choose_prefix(prefix_survival(conf, self._conf_temps), self._cost)  # (): L in 0..γ
            n, bonus = truncate_verify(n, bonus, limit, logits[0], temperature, self.generator, top_k, top_p)
            self.verify_len.copy_(limit)
        if self.conf_out is not None:
            self.conf_out.copy_(conf)
        # [d_1..d_n, bonus, bonus, ...]: slot k < n holds d_{k+1}, the rest the bonus.
        committed = torch.where(self._offsets < n, verify_in.roll(-1), bonus)  # (γ+1,)
        self.drafter.commit(cap.aux, p, committed, n, window)  # before seq_len moves: p is that buffer
        self.out.copy_(torch.cat([n.view(1), committed, nonfinite(logits[0]).long().view(1)]))
        self.seq_len.add_(n + 1)
        self.anchor.copy_(bonus)

    def _draft_block(self, temperature: float, window: int):
        """The draft's γ tokens after the anchor at p = seq_len: tokens (γ,), probabilities (γ, V)
        or None (greedy), confidences (γ,) or None."""
        return self.drafter.propose(self.anchor, self.seq_len, temperature, self.generator, window)

    def _ar_step(self, temperature: float, window: int, trunc: tuple[int, float] = (0, 1.0)) -> None:
        p = self.seq_len  # (); p < window
        logits, _ = self.target.forward_static(self.anchor.view(1, 1), self.cache, p.view(1), window=window)
        tok = pick_token(logits[0, -1], temperature, self.generator, *trunc)
        self.out[0].zero_()  # in-place on the device: a Python scalar would be a host copy
        self.out[1].copy_(tok)
        self.out[-1].copy_(nonfinite(logits[0, -1]))
        self.seq_len.add_(1)
        self.anchor.copy_(tok)

    def _step(self, mode: str, temperature: float, window: int, trunc: tuple[int, float] = (0, 1.0)):
        return partial(self._spec_round if mode == "spec" else self._ar_step, temperature, window, trunc)

    def _commit_state(self, keep: int) -> None:
        """Recurrent targets: the last round's first `keep` verify tokens become the state."""
        self.graphs.run(("commit", keep), partial(self.target.commit_static, self.cache, keep))

    def _window_for(self, mode: str, seq_len: int) -> int:
        """The smallest window holding every slot a step at committed length seq_len writes."""
        last = seq_len + (self.gamma if mode == "spec" else 0)
        return next(w for w in self.windows if w > last)

    def _prepare(self, mode: str, temperature: float, first: int, last: int,
                 trunc: tuple[int, float] = (0, 1.0)) -> None:
        """Capture the graphs of the windows used by steps starting at committed lengths
        first..last (windows too small for any step are never used, so never captured). Warm-up
        runs clobber the engine state, so this happens before a prefill."""
        lo, hi = self._window_for(mode, first), self._window_for(mode, last)
        for w in self.windows:
            if lo <= w <= hi:
                self._reset()
                self.graphs.prepare((mode, temperature, w, trunc), self._step(mode, temperature, w, trunc))
        if mode == "spec" and self._recurrent:  # after a round was captured, so its inputs exist
            for keep in range(1, self.gamma + 2):
                self.graphs.prepare(("commit", keep), partial(self.target.commit_static, self.cache, keep))
        self._reset()

    # ---- one request --------------------------------------------------------------------

    def check_fits(self, prompt_len: int, max_tokens: int) -> None:
        if prompt_len < 1:
            raise ContextLengthError("the prompt is empty")
        if prompt_len >= self.max_context:
            raise ContextLengthError(
                f"the prompt has {prompt_len} tokens; this server's context is {self.max_context} tokens "
                f"(prompt plus generated), so a prompt may have at most {self.max_context - 1}"
            )
        if prompt_len + max_tokens > self.max_context:
            raise ContextLengthError(
                f"prompt ({prompt_len} tokens) plus max_tokens ({max_tokens}) exceeds this server's context "
                f"of {self.max_context} tokens"
            )

    @torch.no_grad()  # compiled under grad mode, a step would trace a backward (none exists for our FP8 ops)
    def warmup(self, mode: str = "spec", temperature: float = 0.0) -> None:
        """Capture the step's graphs now (no-op off CUDA), so the first request is not slower."""
        self._prepare(mode, temperature, 1, self.max_context - 1)

    def _reset(self) -> None:
        self.seq_len.zero_()
        self.anchor.zero_()
        self.cache.reset()

    def _prefill(self, prompt_ids: list[int], temperature: float,
                 trunc: tuple[int, float] = (0, 1.0)) -> torch.Tensor:
        """The prompt through the target, the first token drawn -> () bool on the device: whether the
        target's logits there were not finite (decode.nonfinite), for the caller's one host read."""
        ids = torch.tensor([prompt_ids], device=self.device)  # (1, P)
        pos = torch.arange(len(prompt_ids), device=self.device)  # (P,)
        self.cache.reset()  # recurrent states from zero (attention slots need nothing)
        logits, cap = self.target.forward_static(ids, self.cache, pos, logits_from=len(prompt_ids) - 1)
        self.anchor.copy_(pick_token(logits[0, -1], temperature, self.generator, *trunc))
        if self.drafter is not None:  # the prompt's captures, each with the token after it
            self.drafter.commit(cap.aux, 0, torch.cat([ids[0, 1:], self.anchor.view(1)]), len(prompt_ids) - 1)
        self.seq_len.fill_(len(prompt_ids))
        return nonfinite(logits[0, -1])

    @torch.no_grad()
    def generate(self, prompt_ids: list[int], params: SamplingParams, on_tokens: OnTokens | None = None,
                 mode: str = "spec") -> GenStats:
        """Decode one request; `on_tokens` gets each round's committed tokens as they land and
        returns False to cancel (the engine is then free once the round queued ahead is done)."""
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if mode == "spec" and self.draft is None:
            raise ValueError("spec mode needs a draft")
        self.check_fits(len(prompt_ids), params.max_tokens)
        start = time.perf_counter()
        stats = GenStats(prompt_tokens=len(prompt_ids))
        temperature = float(params.temperature) if params.temperature >= GREEDY_BELOW else 0.0
        trunc = (params.top_k, float(params.top_p)) if temperature > 0 else (0, 1.0)  # greedy ignores them
        # Steps start at committed lengths P .. P+max_tokens-2 (the prefill emits the first token).
        self._prepare(mode, temperature, len(prompt_ids), len(prompt_ids) + params.max_tokens - 1, trunc)
        if params.seed is not None:
            self.generator.manual_seed(params.seed)
        bad_logits = self._prefill(prompt_ids, temperature, trunc)  # ()
        first, bad = torch.stack([self.anchor, bad_logits.long()]).tolist()  # host read: the first token
        if bad:  # a target that overflows its dtype: one line, and the engine serves the next request
            raise nonfinite_error(self.target.dtype)
        chunk = [first]
        stats.ttft_s = time.perf_counter() - start
        if self._commit(stats, chunk, params, on_tokens, start):
            stats.total_s = time.perf_counter() - start
            return stats
        most = self.gamma + 1 if mode == "spec" else 1  # tokens one step commits at most
        seq_len = len(prompt_ids)  # the host's copy of p, kept by the per-step read
        in_flight = [self._launch(mode, temperature, seq_len, trunc)]
        while in_flight:
            # The step in flight commits 1..most tokens. If even `most` leave the request short,
            # the next step is needed whatever it commits (unless it ends at EOS), so it is
            # queued now, starting at p + n + 1 <= p + most: the GPU goes from one step to the
            # next without waiting for this loop. Its window covers the furthest start.
            overlap = self._overlap and not (mode == "spec" and self._recurrent)
            if overlap and len(in_flight) == 1 and len(stats.tokens) + most < params.max_tokens:
                in_flight.append(self._launch(mode, temperature, seq_len + most, trunc))
            vals, *conf = self._reads.read(in_flight.pop(0))  # waits for that step's copies only
            if vals[-1]:  # the target overflowed mid-request: one line, and the engine serves on
                self._reads.drop_unread()
                raise nonfinite_error(self.target.dtype, f"after {len(stats.tokens)} generated tokens")
            n = vals[0]
            seq_len += n + 1
            if mode == "spec":
                stats.accepts.append(n)
                if conf:
                    stats.confidences.append(conf[0])
                if self._recurrent:
                    self._commit_state(n + 1)
            if self._commit(stats, vals[1 : n + 2], params, on_tokens, start):
                break
            if not in_flight:
                in_flight.append(self._launch(mode, temperature, seq_len, trunc))
        # A step queued ahead of a request that ended (EOS, cancelled) still runs; it only writes
        # cache slots past the committed length and state the next prefill resets.
        self._reads.drop_unread()
        stats.total_s = time.perf_counter() - start
        return stats

    def _launch(self, mode: str, temperature: float, start_len: int, trunc: tuple[int, float]) -> int:
        """Queue one step whose committed length at start is at most start_len, and the host
        copies of its outputs -> the ticket to read them by."""
        w = self._window_for(mode, start_len)
        self.graphs.run((mode, temperature, w, trunc), self._step(mode, temperature, w, trunc))
        outs = (self.out,) if self.conf_out is None or mode != "spec" else (self.out, self.conf_out)
        return self._reads.stage(*outs)

    @staticmethod
    def _commit(stats: GenStats, chunk: list[int], params: SamplingParams, on_tokens: OnTokens | None,
                start: float) -> bool:
        """Append a round's tokens (cut at EOS / max_tokens), hand them out -> finished?"""
        room = params.max_tokens - len(stats.tokens)
        chunk = chunk[:room]
        finish = "length" if len(chunk) == room else None
        for i, tok in enumerate(chunk):
            if tok in params.eos_ids:
                chunk, finish = chunk[: i + 1], "stop"
                break
        now = time.perf_counter() - start
        stats.tokens += chunk
        stats.token_times += [now] * len(chunk)
        if chunk and on_tokens is not None and on_tokens(chunk) is False:
            finish = "cancelled"
        if finish is not None:
            stats.finish_reason = finish
        return finish is not None
