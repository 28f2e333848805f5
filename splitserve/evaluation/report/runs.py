"""Find the train runs under a sweep directory and read each into one flat summary.

A run directory is any directory holding what `splitserve train` writes (config.yaml,
metrics.jsonl, draft_arch.json) or Hydra's `.hydra/`. A crashed run is summarised as far as its
files go and marked incomplete; nothing here raises on a missing or damaged file.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

# eval.json keys of the trained draft: "trained", "trained@T=1", "trained[humaneval]@T=1"; no
# set means the run's own held-out prompts (data.heldout_prompts).
TRAINED_KEY = re.compile(r"^trained(?:\[(?P<set>[^\]]+)\])?(?:@T=(?P<t>[0-9.e+-]+))?$")
RUN_MARKERS = (".hydra", "config.yaml", "metrics.jsonl", "draft_arch.json")
SKIP_DIRS = ("wandb", "checkpoints")  # never run dirs themselves (wandb writes a config.yaml too)
# Training-length overrides: runs that differ only in these are points on one τ-vs-tokens line.
LENGTH_KEYS = ("train.max_steps", "train.max_minutes")
BLOCK_FAMILIES = ("dspark", "dflash")  # drafts of draft.block_size tokens; the others chain draft.ttt_steps


@dataclass
class EvalPoint:
    """One evaluated draft from eval.json."""

    tau: float
    temperature: float
    per_position: list[float]
    rounds: int


@dataclass
class RunSummary:
    path: Path
    name: str  # relative to the sweep dir
    status: str = "ok"  # ok | "incomplete: <why>"
    overrides: list[str] = field(default_factory=list)  # Hydra task overrides of this job
    draft: str | None = None
    block_size: int | None = None
    markov_rank: int | None = None
    loss: str | None = None
    num_layers: int | None = None
    seed: int | None = None
    train_data: str | None = None
    heldout: str | None = None  # data.heldout_prompts: the name of the main prompt set
    steps: int | None = None
    tokens_seen: int | None = None
    elapsed_s: float | None = None
    trained: dict[float, EvalPoint] = field(default_factory=dict)  # sampling temperature -> result
    untrained: EvalPoint | None = None
    ece_before: float | None = None  # STS fit at the primary sampling temperature
    ece_after: float | None = None
    alpha_curve: list[tuple[int, float]] = field(default_factory=list)  # (tokens_seen, teacher-forced α)
    # Measured greedy τ of earlier (or later) checkpoints of the same run: (tokens_seen, τ), from tau_curve.json
    tau_curve: list[tuple[int, float]] = field(default_factory=list)

    def to_dict(self) -> dict:
        """Plain numbers for report.json (the table's formatting left out)."""
        d = asdict(self)
        d.pop("path")  # `name` is the path relative to the sweep dir
        d["trained"] = {f"{t:g}": asdict(p) for t, p in self.trained.items()}
        return d

    @property
    def complete(self) -> bool:
        return self.status == "ok"

    def tau_at(self, temperature: float) -> float | None:
        point = self.trained.get(temperature)
        return point.tau if point else None

    @property
    def main_eval(self) -> EvalPoint | None:
        """Greedy if measured, else whichever temperature was."""
        return self.trained.get(0.0) or next(iter(self.trained.values()), None)


def _natural_key(path: Path) -> list:
    return [int(s) if s.isdigit() else s for s in re.split(r"(\d+)", str(path))]


def find_run_dirs(sweep_dir: Path) -> list[Path]:
    """Run dirs under sweep_dir (outermost only; .hydra, checkpoints and wandb dirs are not runs)."""
    found: list[Path] = []

    def walk(d: Path) -> None:
        if any((d / m).exists() for m in RUN_MARKERS):
            found.append(d)
            return
        for child in sorted(d.iterdir()):
            if child.is_dir() and not child.name.startswith(".") and child.name not in SKIP_DIRS:
                walk(child)

    walk(Path(sweep_dir))
    return sorted(found, key=_natural_key)


def read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def read_yaml(path: Path):
    """Plain YAML: Hydra saves config.yaml and overrides.yaml unresolved, so `${...}` stays a
    string here as it would through OmegaConf, and the report needs no Hydra install."""
    import yaml

    try:
        return yaml.safe_load(path.read_text())
    except (OSError, ValueError, yaml.YAMLError):
        return None  # a missing or half-written file of a crashed run is reported, not raised


def _eval_point(d: dict) -> EvalPoint:
    return EvalPoint(float(d["tau"]), float(d["temperature"]), list(d["per_position"]), int(d["rounds"]))


def _alpha_curve(path: Path) -> list[tuple[int, float]]:
    curve = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                row = json.loads(line)
                curve.append((int(row["tokens_seen"]), float(row["alpha"])))
            except (ValueError, KeyError, TypeError):
                continue
    return curve


def _tau_curve(path: Path) -> list[tuple[int, float]]:
    """tau_curve.json: [{"tokens_seen": int, "tau": float, ...}, ...] (greedy τ of other checkpoints)."""
    rows = read_json(path)
    curve = []
    for row in rows if isinstance(rows, list) else []:
        try:
            curve.append((int(row["tokens_seen"]), float(row["tau"])))
        except (KeyError, TypeError, ValueError):
            continue
    return sorted(curve)


def _latest_state(run: Path) -> dict | None:
    pointer = run / "checkpoints" / "latest"
    if not pointer.exists():
        return None
    return read_json(pointer.parent / pointer.read_text().strip() / "state.json")


def read_run(path: Path, sweep_dir: Path) -> RunSummary:
    s = RunSummary(path=path, name=path.name if path == sweep_dir else str(path.relative_to(sweep_dir)))
    overrides = read_yaml(path / ".hydra" / "overrides.yaml")
    s.overrides = [str(o) for o in overrides] if isinstance(overrides, list) else []
    problems = []

    cfg = read_yaml(path / "config.yaml")
    if isinstance(cfg, dict):
        draft, loss = cfg.get("draft") or {}, cfg.get("loss") or {}
        s.draft, s.block_size, s.markov_rank = draft.get("name"), draft.get("block_size"), draft.get("markov_rank")
        if draft.get("family", "dspark") not in BLOCK_FAMILIES:  # a chain drafts ttt_steps tokens, no Markov head
            s.block_size, s.markov_rank = draft.get("ttt_steps"), None
        s.num_layers, s.loss = draft.get("num_layers"), loss.get("name") or loss.get("kind")
        data = cfg.get("data") or {}
        s.seed, s.train_data, s.heldout = (cfg.get("train") or {}).get("seed"), data.get("train_path"), \
            data.get("heldout_prompts")
    else:
        problems.append("no config.yaml")
    eval_enabled = bool(((cfg or {}).get("eval") or {}).get("enabled", True))

    state = _latest_state(path)
    max_steps = (cfg.get("train") or {}).get("max_steps") if isinstance(cfg, dict) else None
    if state is None:
        problems.append("no checkpoint")
    else:
        s.steps, s.tokens_seen, s.elapsed_s = state.get("step"), state.get("tokens_seen"), state.get("elapsed_s")
        reached = isinstance(max_steps, int) and isinstance(s.steps, int) and s.steps >= max_steps
        if not (state.get("finished") or reached):
            problems.append(f"stopped at step {s.steps}")

    report = read_json(path / "eval.json")
    if isinstance(report, dict):
        for name, entry in report.items():
            try:
                point = _eval_point(entry)
            except (KeyError, TypeError, ValueError):
                continue
            key = TRAINED_KEY.match(name)
            if key and key["set"] is None:  # "trained[<set>]" entries are other prompt sets
                s.trained.setdefault(point.temperature, point)
            elif name == "untrained":
                s.untrained = point
    elif eval_enabled:
        problems.append("no eval.json")

    cal = read_json(path / "calibration.json")
    if isinstance(cal, dict) and cal.get("fits"):
        s.ece_before, s.ece_after = cal["fits"][0].get("ece_before"), cal["fits"][0].get("ece_after")

    s.alpha_curve = _alpha_curve(path / "metrics.jsonl")
    s.tau_curve = _tau_curve(path / "tau_curve.json")
    if problems:
        s.status = "incomplete: " + ", ".join(problems)
    return s


def read_sweep(sweep_dir: str | Path) -> list[RunSummary]:
    sweep_dir = Path(sweep_dir)
    return [read_run(p, sweep_dir) for p in find_run_dirs(sweep_dir)]


def config_labels(runs: list[RunSummary], drop: tuple[str, ...] = ()) -> list[str]:
    """A short label per run: its overrides minus those every run shares (and minus `drop` keys)."""
    def keep(o: str) -> bool:
        return o.split("=", 1)[0].lstrip("+~") not in drop

    sets = [[o for o in r.overrides if keep(o)] for r in runs]
    common = set.intersection(*(set(x) for x in sets)) if len(sets) > 1 else set()
    labels = []
    for r, ovr in zip(runs, sets):
        own = [o for o in ovr if o not in common]
        labels.append(",".join(own) if own else f"{r.draft or r.name} L{r.num_layers}")
    return labels
