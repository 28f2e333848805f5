"""Held-out acceptance against context length: τ per prompt-length bucket (≤1K, 1K–4K, 4K–8K,
8K–32K by default), so a draft trained on short rows can be seen to lose acceptance past them.

Prompts are cut from real text. Whole held-out conversations (chitchat's held-out split, or any
chat data file of whole conversations) are tokenized as training tokenizes them and read as one
stream in file order. A prompt starts where a conversation starts and ends where an assistant
reply starts (after its header, where the target would begin to answer), so the target continues
a real conversation after a long real history. Bucket (lo, hi] takes `per_bucket` prompts whose
starts are spread over the stream and whose lengths are spread over the bucket, each the cut
nearest its intended length; a bucket the stream or the target's context cannot fill is reported
short or empty. Then each bucket is decoded by speculative decoding against the target
(evaluate.py) and reported as τ, like every other held-out figure.
Glossary: L stream tokens, P prompt length.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from splitserve.data.chat import TokenizedSample
from splitserve.evaluation.evaluate import EvalReport

DEFAULT_EDGES = (1024, 4096, 8192, 32768)


def _k(n: int) -> str:
    return f"{n // 1024}K" if n % 1024 == 0 else str(n)


def bucket_label(lo: int, hi: int) -> str:
    return f"≤{_k(hi)}" if lo == 0 else f"{_k(lo)}–{_k(hi)}"


@dataclass
class Stream:
    """Conversations read one after another: ids (L,), conversation starts, reply starts."""

    ids: list[int]
    starts: list[int]  # where each conversation begins
    replies: list[int]  # where each assistant reply begins (a trained token after an untrained one)

    @classmethod
    def of(cls, samples: Sequence[TokenizedSample]) -> Stream:
        ids, mask, starts = [], [], []
        for s in samples:
            starts.append(len(ids))
            ids += list(s.input_ids)
            mask += [bool(m) for m in s.loss_mask]
        replies = [i for i in range(1, len(ids)) if mask[i] and not mask[i - 1]]
        return cls(ids, starts, replies)


def conversations_path(name_or_path: str) -> str:
    """Whole conversations for the stream: "chitchat" -> its held-out conversations, else a file."""
    from splitserve.data import CHITCHAT_NAME, chitchat_paths

    if name_or_path == CHITCHAT_NAME:
        return str(chitchat_paths().heldout)
    if not Path(name_or_path).exists():
        raise FileNotFoundError(f"conversations file {name_or_path} does not exist")
    return name_or_path


def load_stream(name_or_path: str, tokenizer, chat=None, max_length: int = 1 << 20) -> Stream:
    """The conversations of `name_or_path` tokenized as training tokenizes them (bad rows skipped
    and counted by the loader), as one stream."""
    from splitserve.data import LoadOptions, load_samples

    opts = LoadOptions(chat=chat) if chat is not None else LoadOptions()
    samples, _ = load_samples(conversations_path(name_or_path), tokenizer, max_length, None, opts)
    return Stream.of(samples)


def cut_prompts(stream: Stream, edges: Sequence[int], per_bucket: int, max_prompt: int) -> dict[str, list[list[int]]]:
    """{bucket label: prompts}: per bucket (lo, hi] up to `per_bucket` prompts of lo < P <= min(hi,
    max_prompt) tokens, distinct, in bucket order."""
    if per_bucket < 1 or list(edges) != sorted(set(edges)) or not edges or edges[0] < 1:
        raise ValueError(f"length buckets need increasing positive edges and per_bucket >= 1, got {list(edges)}, "
                         f"{per_bucket}")
    out: dict[str, list[list[int]]] = {}
    lo = 0
    for hi in edges:
        top = min(hi, max_prompt)
        prompts, seen = [], set()
        for i in range(per_bucket if top > lo else 0):
            start = stream.starts[(i * len(stream.starts)) // per_bucket]
            want = start + lo + (i + 0.5) * (top - lo) / per_bucket
            # reply starts r with lo < r - start <= top, the one nearest the intended length
            a = bisect.bisect_right(stream.replies, start + lo)
            b = bisect.bisect_right(stream.replies, start + top)
            if a == b:
                continue
            r = min(stream.replies[a:b], key=lambda x: abs(x - want))
            if (start, r) not in seen:
                seen.add((start, r))
                prompts.append(stream.ids[start:r])
        out[bucket_label(lo, hi)] = prompts
        lo = hi
    return out


@dataclass
class BucketResult:
    label: str
    prompts: int
    mean_prompt_tokens: float
    report: EvalReport | None  # None: no prompt fell in the bucket

    def to_dict(self) -> dict:
        r = self.report
        return {"bucket": self.label, "prompts": self.prompts, "mean_prompt_tokens": self.mean_prompt_tokens,
                "temperature": None if r is None else r.temperature,
                "tau": None if r is None else r.tau, "per_position": None if r is None else r.per_position,
                "rounds": None if r is None else r.rounds, "tokens": None if r is None else r.tokens,
                "exact": None if r is None else r.exact_matches}


def tau_by_length(target, draft, buckets: dict[str, list[list[int]]], max_new_tokens: int, temperature: float,
                  seed: int, eos_ids=None) -> list[BucketResult]:
    """Each bucket's prompts decoded by speculative decoding against the target -> one result per bucket."""
    from splitserve.evaluation.evaluate import evaluate

    out = []
    for label, prompts in buckets.items():
        mean = sum(map(len, prompts)) / len(prompts) if prompts else 0.0
        report = (evaluate(target, draft, prompts, max_new_tokens, temperature, seed, eos_ids=eos_ids,
                           desc=f"eval {label}") if prompts else None)
        out.append(BucketResult(label, len(prompts), mean, report))
    return out


def format_table(named: dict[str, list[BucketResult]]) -> str:
    """Markdown: one row per (draft, bucket)."""
    rows = ["| draft | context bucket | prompts | mean prompt tokens | τ | rounds | exact |", "|" + "---|" * 7]
    for name, results in named.items():
        for b in results:
            r = b.report
            if r is None:
                rows.append(f"| {name} | {b.label} | 0 | - | - | - | - |")
                continue
            exact = "-" if r.exact_matches is None else f"{r.exact_matches}/{r.num_prompts}"
            rows.append(f"| {name} | {b.label} | {b.prompts} | {b.mean_prompt_tokens:.0f} | {r.tau:.3f} | {r.rounds} "
                        f"| {exact} |")
    return "\n".join(rows)


def plot(named: dict[str, list[BucketResult]], path: str | Path, title: str = "held-out τ by context length") -> Path:
    """τ per bucket, one line per draft (buckets without prompts left out)."""
    from splitserve.evaluation.plots import _label, _pyplot, _save

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    labels = list(dict.fromkeys(b.label for results in named.values() for b in results))
    for name, results in named.items():
        pts = [(labels.index(b.label), b.report.tau) for b in results if b.report is not None]
        if pts:
            ax.plot(*zip(*pts), marker="o", ms=4, label=name)
    ax.set_xticks(range(len(labels)), labels)
    _label(ax, "prompt length (tokens)", "τ (accepted + bonus per round)", title)
    return _save(plt, fig, path)


def write(named: dict[str, list[BucketResult]], out_dir: str | Path) -> Path:
    """lengths.json, lengths.md and lengths.png into out_dir."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "lengths.json").write_text(json.dumps({k: [b.to_dict() for b in v] for k, v in named.items()}, indent=1))
    (out / "lengths.md").write_text(format_table(named) + "\n")
    plot(named, out / "lengths.png")
    return out


def read(path: str | Path) -> dict[str, list[BucketResult]]:
    """lengths.json back (reports keep τ, per-position acceptance, rounds and tokens)."""
    raw = json.loads(Path(path).read_text())
    named = {}
    for name, rows in raw.items():
        named[name] = [BucketResult(r["bucket"], r["prompts"], r["mean_prompt_tokens"], None if r["tau"] is None else
                                    EvalReport(tau=r["tau"], per_position=r["per_position"], rounds=r["rounds"],
                                               tokens=r["tokens"], num_prompts=r["prompts"],
                                               temperature=r["temperature"],
                                               block_size=len(r["per_position"]), exact_matches=r["exact"]))
                       for r in rows]
    return named
