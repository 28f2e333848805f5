"""`splitserve eval`, `calibrate` and `report`: measuring a trained draft and reporting a sweep."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from splitserve.checks import check_prompts, draft_meta
from splitserve.cli.flags import Flags, json_object, new_parser


def eval_parser() -> tuple[argparse.ArgumentParser, Flags]:
    from splitserve.config import EvalCommand, ModelsConfig

    p = new_parser(prog="splitserve eval", description="Measure a draft by speculative decoding.")
    f = Flags(p)
    f.add(ModelsConfig, "draft", "--draft", required=True, help="run directory or exported draft directory")
    f.add(ModelsConfig, "target", "--target", help="target name or HF directory (default: the draft's own)")
    f.add(EvalCommand, "prompts", "--prompts", help="prompt rows: {messages}, {prompt} or pre-tokenized {input_ids} lines")
    f.add(EvalCommand, "num_prompts", "--num-prompts", type=int, help="held-out prompts to decode")
    f.add(EvalCommand, "max_new_tokens", "--max-new-tokens", type=int, help="tokens generated per prompt")
    f.add(EvalCommand, "temperature", "--temperature", type=float,
          help="0: greedy (exactness against the target is checked); > 0: lossless speculative sampling")
    f.add(EvalCommand, "seed", "--seed", type=int, help="sampling seed (T > 0)")
    f.add(ModelsConfig, "device", "--device", help="auto (CUDA when available) | cpu | cuda[:N]")
    f.add(EvalCommand, "dtype", "--dtype", help="float32 (exact comparisons) | bfloat16 | auto")
    f.add(EvalCommand, "compare_untrained", "--compare-untrained", action="store_true",
          help="also evaluate a freshly initialised draft")
    f.add(EvalCommand, "json", "--json", action="store_true", help="print the full report as JSON")
    f.add(EvalCommand, "chat_template", "--chat-template", metavar="FILE",
          help="Jinja file replacing the target's chat template (as data.chat_template in training)")
    f.add(EvalCommand, "chat_template_kwargs", "--chat-template-kwargs", type=json_object, metavar="JSON",
          help='handed to the chat template, e.g. \'{"enable_thinking": false}\'')
    f.add(EvalCommand, "length_buckets", "--length-buckets", type=int, nargs="+", metavar="TOKENS",
          help="τ per prompt-length bucket, these upper edges (e.g. 1024 4096 8192 32768): prompts cut from whole "
               "conversations (--prompts: chitchat's held-out ones, or a chat data file) where a reply starts")
    f.add(EvalCommand, "per_bucket", "--per-bucket", type=int, help="prompts per length bucket")
    f.add(EvalCommand, "out_dir", "--out", metavar="DIR", help="length buckets: write lengths.json/.md/.png here")
    f.hub()
    return p, f


def eval_main(argv: list[str]) -> None:
    p, f = eval_parser()
    args = p.parse_args(argv)
    from splitserve.config import EvalCommand, ModelsConfig

    cmd = f.build(EvalCommand, args)
    models = f.build(ModelsConfig, args, dtype=cmd.dtype)

    from splitserve.data import ChatTemplate, DataError
    from splitserve.evaluation.evaluate import evaluate, format_reports
    from splitserve.evaluation.heldout import load_prompt_ids
    from splitserve.loading import load_models
    from splitserve.models.build import untrained_like

    meta = draft_meta(models.draft, "--draft")
    check_prompts(cmd.prompts, "--prompts")
    target, draft = load_models(models, meta)  # a draft made for another target is refused before any weight
    if cmd.length_buckets:
        _eval_lengths(cmd, target, draft, Path(models.draft).name)
        return
    try:
        prompts = load_prompt_ids(cmd.prompts, target.tokenizer, cmd.num_prompts,
                                  ChatTemplate.load(cmd.chat_template, cmd.chat_template_kwargs))
    except DataError as e:
        sys.exit(f"splitserve eval: {e}")
    eos = target.eos_ids()
    reports = {"draft": evaluate(target, draft, prompts, cmd.max_new_tokens, cmd.temperature, cmd.seed, eos_ids=eos)}
    if cmd.compare_untrained:
        import torch

        torch.manual_seed(cmd.seed)
        fresh = untrained_like(draft, target).to(target.dtype).eval()
        reports["untrained"] = evaluate(target, fresh, prompts, cmd.max_new_tokens, cmd.temperature, cmd.seed,
                                        eos_ids=eos)
    if cmd.json:
        print(json.dumps({k: r.to_dict() for k, r in reports.items()}, indent=1))
    else:
        print(format_reports(reports))


def _eval_lengths(cmd, target, draft, name: str) -> None:
    """`splitserve eval --length-buckets ...`: τ per prompt-length bucket, printed and written."""
    from splitserve.data import ChatTemplate, DataError
    from splitserve.evaluation import length_buckets as lb

    limit = target.max_positions or 1 << 20
    try:
        stream = lb.load_stream(cmd.prompts, target.tokenizer, ChatTemplate.load(cmd.chat_template,
                                                                                  cmd.chat_template_kwargs))
        buckets = lb.cut_prompts(stream, cmd.length_buckets, cmd.per_bucket, limit - cmd.max_new_tokens)
    except (DataError, FileNotFoundError, ValueError) as e:
        sys.exit(f"splitserve eval: {e}")
    print(f"{len(stream.ids):,} tokens of conversations; prompts up to {limit - cmd.max_new_tokens:,} tokens "
          f"(the target's {limit:,} positions less --max-new-tokens)")
    results = {name: lb.tau_by_length(target, draft, buckets, cmd.max_new_tokens, cmd.temperature, cmd.seed,
                                      target.eos_ids())}
    print(lb.format_table(results))
    if cmd.out_dir:
        print(f"wrote {lb.write(results, cmd.out_dir)}/lengths.json, lengths.md, lengths.png")


def _run_settings(run_dir: str) -> dict:
    """The resolved config.yaml a train run left, as plain dicts ({} if absent)."""
    from omegaconf import OmegaConf

    path = Path(run_dir) / "config.yaml"
    return OmegaConf.to_container(OmegaConf.load(path)) if path.exists() else {}


def calibrate_parser() -> tuple[argparse.ArgumentParser, Flags]:
    from splitserve.config import CalibrateCommand, ModelsConfig

    p = new_parser(prog="splitserve calibrate",
                                description="Fit per-position STS temperatures for a draft's confidence head.")
    f = Flags(p)
    f.add(CalibrateCommand, "run_dir", help="the training run directory (its calibration.json is rewritten)")
    f.add(ModelsConfig, "target", "--target", help="target name or HF directory (default: the run's own)")
    f.add(CalibrateCommand, "prompts", "--prompts",
          help="held-out chat JSONL (default: the run's data.heldout_prompts)")
    f.add(CalibrateCommand, "num_prompts", "--num-prompts", type=int, help="default: the run's eval.num_prompts")
    f.add(CalibrateCommand, "max_new_tokens", "--max-new-tokens", type=int,
          help="default: the run's eval.max_new_tokens")
    f.add(CalibrateCommand, "temperatures", "--temperature", type=float, action="append", metavar="TEMPERATURE",
          help="sampling temperature to calibrate at (repeatable; default: the run's eval temperature)")
    f.add(CalibrateCommand, "bins", "--bins", type=int,
          help="ECE bins (default: the run's eval.calibration_bins or 10)")
    f.add(ModelsConfig, "device", "--device", help="auto (CUDA when available) | cpu | cuda[:N]")
    f.hub()
    return p, f


def calibrate_main(argv: list[str]) -> None:
    p, f = calibrate_parser()
    args = p.parse_args(argv)
    from splitserve.config import CalibrateCommand, DataConfig, EvalConfig, ModelsConfig, TrainConfig

    cmd = f.build(CalibrateCommand, args)
    models = f.build(ModelsConfig, args, draft=cmd.run_dir, dtype="float32")

    from splitserve.data import ChatTemplate
    from splitserve.evaluation.calibration import calibrate_run, format_fit
    from splitserve.evaluation.heldout import load_prompt_ids
    from splitserve.loading import load_models

    run = _run_settings(cmd.run_dir)
    ev, data = run.get("eval", {}), run.get("data", {})
    meta = draft_meta(cmd.run_dir, "RUN_DIR")
    target, draft = load_models(models, meta)
    prompts_from = cmd.prompts or data.get("heldout_prompts", DataConfig.heldout_prompts)
    # Rendered as the run trained and evaluated them.
    chat = ChatTemplate.load(data.get("chat_template"), data.get("chat_template_kwargs"))
    prompts = load_prompt_ids(prompts_from, target.tokenizer, cmd.num_prompts or ev.get("num_prompts",
                              EvalConfig.num_prompts), chat)
    fits = calibrate_run(cmd.run_dir, target, draft, prompts,
                         cmd.temperatures or [ev.get("temperature", EvalConfig.temperature)],
                         cmd.max_new_tokens or ev.get("max_new_tokens", EvalConfig.max_new_tokens),
                         seed=run.get("train", {}).get("seed", TrainConfig.seed),
                         n_bins=cmd.bins or ev.get("calibration_bins", EvalConfig.calibration_bins),
                         eos_ids=target.eos_ids(), source=f"{len(prompts)} prompts from {prompts_from}")
    print("\n".join(format_fit(f) for f in fits))
    print(f"wrote {Path(cmd.run_dir) / 'calibration.json'}")


def report_parser() -> tuple[argparse.ArgumentParser, Flags]:
    from splitserve.config import ReportCommand

    p = new_parser(prog="splitserve report",
                                description="Summarise the runs of a sweep: report.md table and PNG plots.")
    f = Flags(p)
    f.add(ReportCommand, "sweep_dir", help="a sweep directory (Hydra multirun output) holding one run per folder")
    f.add(ReportCommand, "wandb", "--wandb", action="store_true",
          help="also log the table and plots to wandb (offline by default)")
    f.add(ReportCommand, "wandb_project", "--wandb-project", help="wandb project of --wandb")
    return p, f


def report_main(argv: list[str]) -> None:
    p, f = report_parser()
    from splitserve.config import ReportCommand

    cmd = f.build(ReportCommand, p.parse_args(argv))

    from splitserve.evaluation.report import write_report

    try:
        path = write_report(cmd.sweep_dir, wandb=cmd.wandb, wandb_project=cmd.wandb_project)
    except FileNotFoundError as exc:
        sys.exit(f"splitserve report: {exc}")
    print(path.read_text())
