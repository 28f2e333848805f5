"""The draft ablation on the GPU: DSpark vs its DFlash baseline, γ = 8 vs 16, paper vs prefix loss.

    python bench/ablation_gpu.py train --data TRAIN.jsonl --prompts HELDOUT.jsonl --root R --minutes 6
    python bench/ablation_gpu.py eval  --root R      (prints `splitserve report R/sweep`)
    python bench/ablation_gpu.py best  --root R      (a run dir holding the best measured checkpoint)

It is the sweep `splitserve train -m draft=dspark_b8,dspark_b16 loss=paper,prefix` plus the two
DFlash runs (`draft=dflash_b8,dflash_b16 loss=paper`): each run's RunConfig is composed from
splitserve/conf/ by splitserve.config.compose with the recipe as overrides (Hydra where it is
installed, else the same composition in plain Python, so that it runs where only torch and
transformers are), and trained by splitserve.train.loop.train. The runs share one recipe (RECIPE
below, with --num-layers / --batch-size / --lr to change it for all of them) and all train at
once, one process each: on one GPU they share it (each is small next to an H200); on several,
the runs go round-robin, one GPU each where there are enough.

Equal budget. Processes that share a GPU do not run at the same speed, so every run trains for
the same wall time and checkpoints every --save-every steps, keeping them all. `eval` then takes
S*, the largest checkpoint step that every run reached, and reports every run at S*: the same
data order and batch size, hence exactly the same target tokens for each. Each run's view at S*
is written to R/sweep/<run>/ in the layout `splitserve report` reads, with train.max_steps = S*.
Checkpoints at about S*/3 and 2S*/3, and the run's last one when it went past S*, are measured
too (greedy τ on the same prompts, through the serving engine) and go to tau_curve.json: the
τ-vs-tokens line.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import yaml

from splitserve.config import RunConfig, TrainConfig, compose, from_dict
from splitserve.models.run_files import checkpoint_dirs

REPO = Path(__file__).resolve().parents[1]

# (draft, loss): the 2x2 DSpark grid, then DFlash (markov_rank 0, no confidence head) at both γ
# twice: on CE alone (loss=dflash_ce, the paper's baseline: the "paper-defined" ratio) and on the
# DSpark paper loss (the "head-only" ratio). After them, runs chosen only by --runs: the other
# Markov head forms at γ=16, the further acceptance-aware losses, and EAGLE-3 (its one decoder
# layer as published: --num-layers sizes the block drafts only). The report names the baseline of
# every ratio (splitserve/evaluation/report/ratios.py).
RUNS = [("dspark_b8", "paper"), ("dspark_b8", "prefix"), ("dspark_b16", "paper"), ("dspark_b16", "prefix"),
        ("dflash_b8", "dflash_ce"), ("dflash_b16", "dflash_ce"), ("dflash_b8", "paper"), ("dflash_b16", "paper"),
        ("dspark_b16_gated", "prefix"), ("dspark_b16_rnn", "prefix"), ("dspark_b16", "prefix_gain"),
        ("dspark_b16", "expected_length"), ("dspark_b16", "lk_alpha"), ("dspark_b16", "expected_length_greedy"),
        ("eagle3", "ttt")]
DEFAULT_RUNS = RUNS[:8]
# Drafts whose config group sets their depth and loss as published (conf/draft/eagle3.yaml): the
# recipe's --num-layers and the run's loss= are not applied (the run name keeps the loss's name).
AS_PUBLISHED = {"eagle3"}
RECIPE = dict(num_layers=2, batch_size=8, anchors_per_seq=64, lr=1e-3, markov_lr_scale=1.0, warmup_steps=50,
              max_length=1024)


def recipe(args) -> dict:
    """RECIPE with this invocation's --num-layers / --batch-size / --lr / --anchors /
    --markov-lr-scale, where given."""
    names = ("num_layers", "batch_size", "lr", "anchors_per_seq", "markov_lr_scale")
    given = {k: getattr(args, k, None) for k in names}
    return {**RECIPE, **{k: v for k, v in given.items() if v is not None}}


def run_name(i: int, draft: str, loss: str) -> str:
    return f"{i}_draft={draft},loss={loss}"  # Hydra's job-dir naming, so the report labels match a multirun


def _value(v) -> str:
    """A Python value as an override's right-hand side (strings quoted: paths may hold any character)."""
    if v is None or isinstance(v, bool):
        return {None: "null", True: "true", False: "false"}[v]
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(_value(x) for x in v) + "]"
    return "'" + v.replace("'", "\\'") + "'" if isinstance(v, str) else str(v)


def build_config(args, draft: str, loss: str, run_dir: Path) -> RunConfig:
    """`splitserve train draft=DRAFT loss=LOSS` with the recipe and this invocation's flags."""
    cuda = args.device.startswith("cuda")
    rec = recipe(args)
    settings = {
        "target.dtype": "bfloat16" if cuda else "float32", "target.device": args.device,
        **({} if draft in AS_PUBLISHED else {"draft.num_layers": rec["num_layers"]}),
        "data.train_path": args.data, "data.heldout_prompts": args.prompts, "data.max_length": rec["max_length"],
        "train.seed": getattr(args, "seed", TrainConfig.seed), "train.max_steps": args.max_steps,
        "train.max_minutes": args.minutes, "train.batch_size": rec["batch_size"],
        "train.anchors_per_seq": rec["anchors_per_seq"], "train.lr": rec["lr"],
        "train.markov_lr_scale": rec["markov_lr_scale"], "train.warmup_steps": rec["warmup_steps"],
        "train.log_every": args.log_every, "train.save_every": args.save_every, "train.keep_checkpoints": 0,
        "train.device": args.device, "train.precision": "bf16" if cuda else "fp32",
        "eval.num_prompts": args.num_prompts, "eval.max_new_tokens": args.max_new_tokens,
        "eval.extra_temperatures": [1.0], "eval.compare_untrained": False, "eval.prompt_sets": list(args.prompt_sets),
        "eval.regenerate_history": args.regenerate_history, "run_dir": str(run_dir),
    }
    if args.capture_graphs is not None:  # else the config's default: on for a target on CUDA
        settings["target.capture_graphs"] = args.capture_graphs
    if args.group_tokens is not None:
        settings["target.capture_group_tokens"] = args.group_tokens
    if args.loss_chunk_rows is not None:
        settings["train.loss_chunk_rows"] = args.loss_chunk_rows
    groups = [f"draft={draft}"] + ([] if draft in AS_PUBLISHED else [f"loss={loss}"])
    groups += [f"target={args.target}"] if getattr(args, "target", None) else []
    overrides = [*groups, *(f"{k}={_value(v)}" for k, v in settings.items())]
    cfg = compose(overrides)
    markov_rank = getattr(args, "markov_rank", None)
    if markov_rank is not None and cfg.draft.markov_rank > 0:  # resizes DSpark's head; DFlash keeps rank 0
        overrides.append(f"draft.markov_rank={markov_rank}")
        cfg = compose(overrides)
    draft_vocab = getattr(args, "draft_vocab", None)
    if draft_vocab is not None and draft not in AS_PUBLISHED:  # EAGLE-3 keeps its own (32000)
        cfg = compose([*overrides, f"draft.draft_vocab_size={draft_vocab}"])
    return cfg


def write_config(cfg: RunConfig, run_dir: Path, overrides: list[str]) -> None:
    """config.yaml as `splitserve train` writes it, and the overrides that name the job."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(asdict(cfg), sort_keys=False))
    (run_dir / ".hydra").mkdir(exist_ok=True)
    (run_dir / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))


def read_config(run_dir: Path) -> RunConfig:
    return from_dict(RunConfig, yaml.safe_load((run_dir / "config.yaml").read_text()))


# ---- workers (one process per run) ---------------------------------------------------------


def train_one(run_dir: Path) -> None:
    from splitserve.train.loop import train

    train(read_config(run_dir))


def eval_one(run_dir: Path, view: Path, s_star: int, curve_points: bool = True, check_exact: bool = True,
             engine: bool = False) -> None:
    """The run at S* (table row: greedy with STS fit, T=1) and its other checkpoints (τ curve).
    `engine`: the S* row through the serving engine too (eval.engine), not the reference loop."""
    import torch

    from splitserve.evaluation.evaluate import evaluate
    from splitserve.evaluation.heldout import evaluate_run, load_prompt_ids
    from splitserve.loading import load_draft, read_draft_meta
    from splitserve.target import load_target
    from splitserve.target.eos import eos_ids
    from splitserve.target.hf import pick_device
    from splitserve.train.checkpoint import read_state

    cfg = read_config(run_dir)
    ckpts = checkpoint_dirs(run_dir)
    view.mkdir(parents=True, exist_ok=True)
    (view / "checkpoints" / ckpts[s_star].name).mkdir(parents=True, exist_ok=True)
    shutil.copy(ckpts[s_star] / "state.json", view / "checkpoints" / ckpts[s_star].name / "state.json")
    (view / "checkpoints" / "latest").write_text(ckpts[s_star].name)
    shutil.copy(run_dir / "draft_arch.json", view / "draft_arch.json")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    (view / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows if r["step"] <= s_star))
    vcfg = replace(cfg, train=replace(cfg.train, max_steps=s_star), run_dir=str(view),
                   eval=replace(cfg.eval, check_exact=check_exact, engine=engine))
    overrides = yaml.safe_load((run_dir / ".hydra" / "overrides.yaml").read_text())
    write_config(vcfg, view, overrides)

    target = load_target(cfg.target, pick_device(cfg.target.device))
    meta = read_draft_meta(run_dir)  # once, for every checkpoint measured

    def draft_at(step: int):
        return load_draft(meta, target, checkpoint=ckpts[step]).float()

    evaluate_run(vcfg, target, draft_at(s_star))
    steps = sorted(ckpts)
    points = {min(steps, key=lambda s: abs(s - s_star * f)) for f in (1 / 3, 2 / 3)} | {steps[-1]}
    points = points - {s_star} if curve_points else set()
    prompts = load_prompt_ids(cfg.data.heldout_prompts, target.tokenizer, cfg.eval.num_prompts)
    # Curve points through the serving engine (static caches, CUDA graphs on a GPU): the same
    # greedy rounds as the reference loop, pooled the same way, in a fraction of the time.
    eos = eos_ids(target)
    curve = []
    for step in sorted(points):
        rep = evaluate(target, draft_at(step), prompts, cfg.eval.max_new_tokens, check_exact=False, eos_ids=eos,
                       desc=f"eval step {step}", engine=True)
        state = read_state(ckpts[step])
        curve.append({"step": step, "tokens_seen": state.tokens_seen, "tau": rep.tau, "rounds": rep.rounds,
                      "per_position": rep.per_position, "measured_with": "serving engine",
                      "checkpoint": ckpts[step].name})
        print(f"[eval] {view.name} step {step}: τ {rep.tau:.3f}", flush=True)
        del rep
        torch.cuda.empty_cache() if torch.cuda.is_available() else None
    (view / "tau_curve.json").write_text(json.dumps(curve, indent=1))


# ---- drivers --------------------------------------------------------------------------------


def _gpu_count() -> int:
    try:
        import torch

        return torch.cuda.device_count()
    except ImportError:
        return 0


def _spawn(argv: list[str], log: Path, n_procs: int, index: int = 0) -> subprocess.Popen:
    """Worker `index` of `n_procs`: its share of the host's cores and, where the host has several
    GPUs, GPU index mod count to itself (runs spread round-robin; one GPU: they all share it)."""
    threads = max(1, (os.cpu_count() or 1) // n_procs)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
           "OMP_NUM_THREADS": str(threads)}
    gpus = _gpu_count()
    if gpus > 1 and "CUDA_VISIBLE_DEVICES" not in os.environ:
        env["CUDA_VISIBLE_DEVICES"] = str(index % gpus)
    return subprocess.Popen([sys.executable, __file__, *argv], stdout=open(log, "w"), stderr=subprocess.STDOUT,
                            env=env, cwd=REPO)


def _wait(procs: dict[str, subprocess.Popen], progress) -> dict[str, int]:
    """Poll the workers; if the driver is stopped (Ctrl-C, `timeout`), stop them too."""
    def stop(signum, frame):
        for p in procs.values():
            p.terminate()
        sys.exit(f"stopped by signal {signum}; workers terminated")

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    t0 = time.time()
    while any(p.poll() is None for p in procs.values()):
        time.sleep(15)
        print(f"[{time.time() - t0:5.0f} s] " + "  ".join(f"{k}: {progress(k)}" for k in procs), flush=True)
    return {k: p.returncode for k, p in procs.items()}


def _last_metrics(run_dir: Path) -> dict:
    path = run_dir / "metrics.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return json.loads(lines[-1]) if lines else {}


def cmd_train(args) -> None:
    root = Path(args.root).resolve()
    dirs = {}
    chosen = set(args.runs) if args.runs else {f"{d}:{lo}" for d, lo in DEFAULT_RUNS}
    unknown = chosen - {f"{d}:{lo}" for d, lo in RUNS}
    if unknown:
        sys.exit(f"--runs: unknown {sorted(unknown)}; choose from {[f'{d}:{lo}' for d, lo in RUNS]}")
    for i, (draft, loss) in enumerate(RUNS):
        if f"{draft}:{loss}" not in chosen:
            continue
        run_dir = root / "runs" / run_name(i, draft, loss)
        write_config(build_config(args, draft, loss, run_dir), run_dir, [f"draft={draft}", f"loss={loss}"])
        dirs[run_dir.name] = run_dir
    procs = {k: _spawn(["_train", str(d)], d / "train.log", len(dirs), i) for i, (k, d) in enumerate(dirs.items())}

    def progress(k):
        m = _last_metrics(dirs[k])
        return f"step {m.get('step', 0)} α {m.get('alpha', 0):.2f}"

    codes = _wait(procs, progress)
    summary = {}
    for k, d in dirs.items():
        m = _last_metrics(d)
        summary[k] = {"exit": codes[k], "checkpoints": sorted(checkpoint_dirs(d)), "tokens_seen": m.get("tokens_seen"),
                      "tok_per_s": m.get("tok_per_s"), "alpha": m.get("alpha")}
        print(f"{k}: exit {codes[k]}, checkpoints {summary[k]['checkpoints']}, {m.get('tok_per_s', 0):,.0f} tok/s")
        if codes[k]:
            print((d / "train.log").read_text()[-3000:])
    (root / "train_summary.json").write_text(json.dumps({"recipe": recipe(args), "minutes": args.minutes,
                                                        "runs": summary}, indent=1))


def cmd_eval(args) -> None:
    root = Path(args.root).resolve()
    dirs = {d.name: d for d in sorted((root / "runs").iterdir()) if (d / "config.yaml").exists()}
    common = set.intersection(*(set(checkpoint_dirs(d)) for d in dirs.values()))
    if not common:
        sys.exit("no checkpoint step that every run reached")
    s_star = args.step or max(common)
    print(f"S* = step {s_star} (reached by every run)", flush=True)
    flags = [str(int(args.curve)), str(int(args.exact)), str(int(args.engine))]
    procs = {k: _spawn(["_eval", str(d), str(root / "sweep" / k), str(s_star), *flags], d / "eval.log", len(dirs), i)
             for i, (k, d) in enumerate(dirs.items())}

    def progress(k):
        return "done" if (root / "sweep" / k / "tau_curve.json").exists() else "..."

    codes = _wait(procs, progress)
    for k, code in codes.items():
        if code:
            print(f"{k}: exit {code}\n" + (dirs[k] / "eval.log").read_text()[-3000:])
    from splitserve.evaluation.report import write_report

    print(Path(write_report(root / "sweep")).read_text())


def cmd_best(args) -> None:
    """Print a run directory whose latest checkpoint is the one with the highest measured greedy τ
    (R/best, pointing at that checkpoint): the draft to serve and benchmark."""
    root = Path(args.root).resolve()
    best = None
    for view in sorted(d for d in (root / "sweep").iterdir() if (d / "tau_curve.json").exists()):
        run_dir = root / "runs" / view.name
        points = [(p["tau"], p["step"]) for p in json.loads((view / "tau_curve.json").read_text())]
        ev = json.loads((view / "eval.json").read_text())["trained"]
        points.append((ev["tau"], yaml.safe_load((view / "config.yaml").read_text())["train"]["max_steps"]))
        for tau, step in points:
            if best is None or tau > best[0]:
                best = (tau, run_dir, step)
    tau, run_dir, step = best
    out = root / "best"
    shutil.rmtree(out, ignore_errors=True)
    (out / "checkpoints").mkdir(parents=True)
    shutil.copy(run_dir / "draft_arch.json", out / "draft_arch.json")
    shutil.copy(run_dir / "config.yaml", out / "config.yaml")
    ckpt = checkpoint_dirs(run_dir)[step]
    (out / "checkpoints" / ckpt.name).symlink_to(ckpt)
    (out / "checkpoints" / "latest").write_text(ckpt.name)
    (out / "source.json").write_text(json.dumps({"run": run_dir.name, "step": step, "greedy_tau": tau}))
    print(f"best: {run_dir.name} step {step}, held-out greedy τ {tau:.3f}", file=sys.stderr)
    print(out)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] in ("_train", "_eval"):
        if sys.argv[1] == "_train":
            train_one(Path(sys.argv[2]))
        else:
            eval_one(Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4]), *(a != "0" for a in sys.argv[5:8]))
        return
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train")
    t.add_argument("--data", required=True, help="chat JSONL (the target's own regenerated replies)")
    t.add_argument("--prompts", required=True, help="held-out prompt JSONL, never trained on")
    t.add_argument("--root", required=True)
    t.add_argument("--minutes", type=float, default=6.0, help="training wall time of every run")
    t.add_argument("--max-steps", type=int, default=100_000)
    t.add_argument("--save-every", type=int, default=50)
    t.add_argument("--log-every", type=int, default=25)
    t.add_argument("--device", default="cuda")
    t.add_argument("--target", default=None, help="a conf/target option, e.g. gemma3-270m (default: the config's)")
    t.add_argument("--capture-graphs", action=argparse.BooleanOptionalAction, default=None,
                   help="target.capture_graphs (target/bucketed.py); default: the config's (on for CUDA)")
    t.add_argument("--group-tokens", type=int, default=None,
                   help="target.capture_group_tokens: a length bucket's samples per capture forward, in tokens")
    t.add_argument("--loss-chunk-rows", type=int, default=None,
                   help="train.loss_chunk_rows: the loss's vocabulary-wide terms this many rows at a time "
                        "(for --anchors 512 and large vocabularies)")
    t.add_argument("--runs", nargs="+", default=None, metavar="DRAFT:LOSS",
                   help="train only these runs, e.g. dspark_b16:prefix (default: the 2x2 grid and the four DFlash "
                        "baselines; dspark_b16_gated:prefix and dspark_b16_rnn:prefix on request; fewer runs share the "
                        "GPU "
                        "and host with fewer others, so each goes further in the same minutes)")
    t.add_argument("--num-layers", type=int, default=None, help=f"draft layers (recipe: {RECIPE['num_layers']})")
    t.add_argument("--batch-size", type=int, default=None, help=f"sequences per step (recipe: {RECIPE['batch_size']})")
    t.add_argument("--lr", type=float, default=None, help=f"peak learning rate (recipe: {RECIPE['lr']})")
    t.add_argument("--anchors", dest="anchors_per_seq", type=int, default=None,
                   help=f"anchors per sequence (recipe: {RECIPE['anchors_per_seq']})")
    t.add_argument("--markov-lr-scale", type=float, default=None,
                   help="the Markov head's learning rate as a multiple of --lr (recipe: 1)")
    t.add_argument("--markov-rank", type=int, default=None,
                   help="the Markov head's rank r for the DSpark runs (conf: 256; DFlash keeps 0)")
    t.add_argument("--draft-vocab", type=int, default=None,
                   help="draft.draft_vocab_size for the DSpark and DFlash runs: a head over the N most frequent "
                        "trained tokens (default: the whole vocabulary)")
    t.add_argument("--seed", type=int, default=TrainConfig.seed,
                   help="train.seed: initialisation, data order and anchors (another seed measures run-to-run noise)")
    t.add_argument("--num-prompts", type=int, default=40, help="prompts per held-out set")
    t.add_argument("--max-new-tokens", type=int, default=256)
    t.add_argument("--prompt-sets", nargs="*", default=["humaneval", "mtbench"],
                   help="held-out sets measured next to --prompts (eval.prompt_sets: humaneval, mtbench, mtbench2)")
    t.add_argument("--no-regenerate-history", dest="regenerate_history", action="store_false",
                   help="keep the prompts' human-written history turns (default: the target regenerates them)")
    e = sub.add_parser("eval")
    e.add_argument("--root", required=True)
    e.add_argument("--step", type=int, default=None, help="report every run at this step (default: S*)")
    e.add_argument("--no-curve", dest="curve", action="store_false",
                   help="measure S* only (each curve point is one more greedy evaluation per run)")
    e.add_argument("--no-exact", dest="exact", action="store_false",
                   help="skip the target-alone decode that counts exact greedy replies (eval.check_exact=false)")
    e.add_argument("--engine", action="store_true",
                   help="decode the S* evaluation through the serving engine (eval.engine=true): seconds, not minutes")
    b = sub.add_parser("best")
    b.add_argument("--root", required=True)
    args = ap.parse_args()
    {"train": cmd_train, "eval": cmd_eval, "best": cmd_best}[args.cmd](args)


if __name__ == "__main__":
    main()
