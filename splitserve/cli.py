"""The `splitserve` console script. Entry points stay thin: parse, build, run, close.

    splitserve train  [hydra overrides]   distil a draft, then evaluate it on held-out prompts
    splitserve dump   [hydra overrides]   store the target's hidden states for offline training
    splitserve eval   --draft D [...]     speculative decoding against the real target
    splitserve export RUN_DIR OUT_DIR     Hugging Face (or --format speculators / sglang) checkpoint of a draft
    splitserve gen    --out FILE [...]    regenerate a prompt set's assistant turns with the target
    splitserve calibrate RUN_DIR          fit STS temperatures of the confidence head (calibration.json)
    splitserve report SWEEP_DIR           Markdown table and PNG plots over the runs of a sweep
    splitserve serve  --draft D [...]     OpenAI-compatible HTTP server (batch-1 speculative engine)
    splitserve bench  --draft D [...]     batch-1 latency on synthetic prompts, optionally vs baselines

`train` and `dump` are Hydra apps over the package's `splitserve/conf/` (so `-m` multirun
sweeps work; splitserve.config.compose gives the same RunConfig to scripts); the other commands
take plain flags, each bound to a field of their config dataclasses (Flags), defaults in
config.py. A user error (a bad file, row, flag, port or draft) prints one line and exits 1;
`--debug` anywhere on the line shows its traceback instead.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

from splitserve.checks import check_export_dir, check_prompts, check_train_data, draft_meta, user_error_types
from splitserve.config import PACKAGE_CONF  # noqa: F401  (tests read the package's conf/ through cli)
from splitserve.config import conf_dir as config_conf_dir

USAGE = __doc__.split("\n\n")[1]
DEBUG_FLAG = "--debug"


def conf_dir() -> Path:
    """config.conf_dir (the package's conf/, or SPLITSERVE_CONF), its error as the exit line."""
    try:
        return config_conf_dir()
    except FileNotFoundError as exc:
        sys.exit(f"splitserve: {exc}")


def _register_schema() -> None:
    from hydra.core.config_store import ConfigStore

    from splitserve.config import RunConfig

    ConfigStore.instance().store(name="base_config", node=RunConfig)


def to_run_config(dcfg):
    """DictConfig -> RunConfig, once, at the edge; multirun jobs write into Hydra's job dir."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    from omegaconf import OmegaConf

    cfg = OmegaConf.to_object(dcfg)
    hc = HydraConfig.get()
    if hc.mode == RunMode.MULTIRUN:
        cfg.run_dir = hc.runtime.output_dir
    return cfg


def _save_resolved(cfg, run_dir: Path) -> None:
    from omegaconf import OmegaConf

    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.structured(cfg)))


class Flags:
    """argparse flags bound to config dataclass fields (splitserve/config/): a flag's default
    is its field's, so each default is written once, and `build` turns the parsed namespace back
    into the dataclass. Every flag of a command but --help is bound (tests/test_cli_flags.py)."""

    def __init__(self, parser: argparse.ArgumentParser):
        self.parser = parser
        self.bound: dict[str, tuple[type, Callable | None]] = {}  # dest (the field's name) -> (class, convert)

    def add(self, cls: type, name: str, *flags: str, group=None, convert: Callable | None = None, **kw) -> None:
        """Field `cls.name` as `flags` (none: a positional argument named as the field). `kw` as
        argparse's; a `default` given here is one no field holds (e.g. from the environment)."""
        if name in self.bound and self.bound[name][0] is not cls:
            raise ValueError(f"{name} is bound to {self.bound[name][0].__name__} already")
        where = group or self.parser
        self.bound[name] = (cls, convert)
        if not flags:
            where.add_argument(name, **kw)
            return
        if "default" not in kw and not kw.get("required"):
            default = field_default(cls, name)
            kw["default"] = list(default) if kw.get("action") == "append" and default is not None else default
        where.add_argument(*flags, dest=name, **kw)

    def build(self, cls: type, args: argparse.Namespace, **given):
        """The `cls` its flags describe; `given`: fields with no flag of their own."""
        values = {}
        for name, (c, convert) in self.bound.items():
            if c is cls:
                value = getattr(args, name)
                values[name] = convert(value) if convert is not None and value is not None else value
        return cls(**values, **given)

    def hub(self) -> None:
        """--revision / --trust-remote-code for every command that loads the target (train and
        dump take them as target.revision / target.trust_remote_code)."""
        from splitserve.config import ModelsConfig

        self.add(ModelsConfig, "revision", "--revision",
                 help="a branch, tag or commit of a hub target (from_pretrained)")
        self.add(ModelsConfig, "trust_remote_code", "--trust-remote-code", action="store_true",
                 help="run the target's own modelling code from its directory (from_pretrained)")


def field_default(cls: type, name: str):
    f = {f.name: f for f in dataclasses.fields(cls)}[name]
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    raise ValueError(f"{cls.__name__}.{name} has no default: bind it with required=True or a default")


def json_object(text: str) -> dict:
    """argparse type of --chat-template-kwargs: a JSON object."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not JSON: {e}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return value


def hydra_app(command: str, argv: list[str]) -> None:
    import hydra

    _register_schema()
    failed: list[BaseException] = []  # raised again after Hydra returns, so it never prints them

    @hydra.main(config_path=str(conf_dir()), config_name="config", version_base="1.3")
    def app(dcfg) -> None:
        try:
            run(dcfg)
        except user_error_types() as exc:
            failed.append(exc)

    def run(dcfg) -> None:
        cfg = to_run_config(dcfg)
        if command == "train" and int(os.environ.get("WORLD_SIZE", "1")) > 1:
            from splitserve.split.runner import run_split

            if os.environ.get("RANK") == "0":
                _save_resolved(cfg, Path(cfg.run_dir))
            run_split(cfg)  # a torchrun job split into target and draft ranks
        elif command == "train":
            from splitserve.evaluation.heldout import evaluate_run
            from splitserve.target import DECODING_BACKENDS
            from splitserve.train.loop import train

            check_train_data(cfg)
            _save_resolved(cfg, Path(cfg.run_dir))
            result = train(cfg)
            if cfg.eval.enabled and cfg.target.backend not in DECODING_BACKENDS:
                # Held-out evaluation decodes, which only the transformers backend does.
                print(f"[train] held-out evaluation skipped (target.backend={cfg.target.backend} only captures); "
                      f"run: splitserve eval --draft {cfg.run_dir}")
            elif cfg.eval.enabled:
                evaluate_run(cfg, result.target, result.draft)
        else:
            from splitserve.stream.dump_capture import run_dump

            _save_resolved(cfg, Path(cfg.dump.out_dir))
            run_dump(cfg)

    sys.argv = [f"splitserve {command}", *argv]
    app()
    if failed:
        raise failed[0]


def eval_parser() -> tuple[argparse.ArgumentParser, Flags]:
    from splitserve.config import EvalCommand, ModelsConfig

    p = argparse.ArgumentParser(prog="splitserve eval", description="Measure a draft by speculative decoding.")
    f = Flags(p)
    f.add(ModelsConfig, "draft", "--draft", required=True, help="run directory or exported draft directory")
    f.add(ModelsConfig, "target", "--target", help="target name or HF directory (default: the draft's own)")
    f.add(EvalCommand, "prompts", "--prompts", help="chat JSONL ({messages} or {prompt} lines)")
    f.add(EvalCommand, "num_prompts", "--num-prompts", type=int)
    f.add(EvalCommand, "max_new_tokens", "--max-new-tokens", type=int)
    f.add(EvalCommand, "temperature", "--temperature", type=float)
    f.add(EvalCommand, "seed", "--seed", type=int)
    f.add(ModelsConfig, "device", "--device")
    f.add(EvalCommand, "dtype", "--dtype")
    f.add(EvalCommand, "compare_untrained", "--compare-untrained", action="store_true",
          help="also evaluate a freshly initialised draft")
    f.add(EvalCommand, "json", "--json", action="store_true", help="print the full report as JSON")
    f.add(EvalCommand, "chat_template", "--chat-template", metavar="FILE",
          help="Jinja file replacing the target's chat template (as data.chat_template in training)")
    f.add(EvalCommand, "chat_template_kwargs", "--chat-template-kwargs", type=json_object, metavar="JSON",
          help='handed to the chat template, e.g. \'{"enable_thinking": false}\'')
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
    from splitserve.models.build import build_draft

    meta = draft_meta(models.draft, "--draft")
    check_prompts(cmd.prompts, "--prompts")
    target, draft = load_models(models, meta)  # a draft made for another target is refused before any weight
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
        reports["untrained"] = evaluate(target, build_draft(meta.arch, target).to(target.dtype).eval(), prompts,
                                        cmd.max_new_tokens, cmd.temperature, cmd.seed, eos_ids=eos)
    if cmd.json:
        print(json.dumps({k: r.to_dict() for k, r in reports.items()}, indent=1))
    else:
        print(format_reports(reports))


def export_parser() -> tuple[argparse.ArgumentParser, Flags]:
    from splitserve.config import ExportCommand, ModelsConfig

    p = argparse.ArgumentParser(prog="splitserve export", description="Export a trained draft as an HF checkpoint "
                                "(default), as the speculators checkpoint vLLM serves (--format speculators), "
                                "or as the checkpoint SGLang's DSPARK loader reads (--format sglang).")
    f = Flags(p)
    f.add(ExportCommand, "run_dir")
    f.add(ExportCommand, "out_dir")
    f.add(ModelsConfig, "target", "--target", help="target name or HF directory (default: the run's own)")
    f.add(ExportCommand, "format", "--format", choices=["hf", "speculators", "sglang"],
          help="checkpoint layout (default: hf; docs/deploy.md)")
    f.add(ExportCommand, "algorithm", "--algorithm", choices=["dspark", "dflash"],
          help="sglang format: dspark (the default); dflash is refused, see docs/deploy.md")
    f.add(ExportCommand, "keep_fp32", "--keep-fp32", action="store_true",
          help="speculators format: keep float32 weights (default: bfloat16); refused for sglang")
    f.add(ExportCommand, "force", "--force", action="store_true", help="replace OUT_DIR if it exists and is not empty")
    f.hub()
    return p, f


def export_main(argv: list[str]) -> None:
    p, f = export_parser()
    args = p.parse_args(argv)
    from splitserve.config import ExportCommand, ModelsConfig

    cmd = f.build(ExportCommand, args)
    if cmd.format == "sglang" and (cmd.keep_fp32 or cmd.algorithm == "dflash"):
        from splitserve.export.sglang import refuse_options

        refuse_options(cmd.algorithm, cmd.keep_fp32)
    out_dir = check_export_dir(cmd.out_dir, cmd.force)

    from splitserve.export import export_draft
    from splitserve.loading import load_models, target_config_for
    from splitserve.speculative.calibration_file import load_calibration

    meta = draft_meta(cmd.run_dir, "RUN_DIR")
    # An export needs of the target only its embedding and lm_head: two tensors, not the model.
    models = f.build(ModelsConfig, args, draft=cmd.run_dir, device="cpu", dtype="float32")
    target, draft = load_models(models, meta, shared_weights_only=True)
    calibration = load_calibration(cmd.run_dir)
    if out_dir.exists():  # --force: replaced whole, so no file of the old export survives
        import shutil

        shutil.rmtree(out_dir)
    text_cfg = target.config.get_text_config()
    max_pos = int(getattr(text_cfg, "max_position_embeddings", 32768))
    if cmd.format in ("speculators", "sglang"):
        from splitserve.assets import resolve_target_path

        # what the server opens
        served_target = str(Path(resolve_target_path(target_config_for(meta, models).path)).resolve())
    if cmd.format == "speculators":
        import torch

        from splitserve.export.speculators import export_speculators, vllm_command

        exp = export_speculators(draft, cmd.out_dir, served_target, list(target.config.architectures or []),
                                 target.info.hidden_size, max_pos, torch.float32 if cmd.keep_fp32 else torch.bfloat16)
        print(f"exported {cmd.run_dir} ({meta.kind}) -> {exp.out_dir} in the speculators DSpark layout (vLLM)")
        try:
            print(vllm_command(exp, served_target))
        except ValueError as exc:
            print(f"note: {exc}")
        return
    if cmd.format == "sglang":
        from splitserve.export.sglang import export_sglang, launch_command

        exp = export_sglang(draft, cmd.out_dir, target.info.num_layers, calibration, max_pos)
        print(f"exported {cmd.run_dir} ({meta.kind}) -> {exp.out_dir} for SGLang DSPARK")
        print(launch_command(exp, served_target))
        return
    out = export_draft(draft, cmd.out_dir, target.info, calibration)
    print(f"exported {cmd.run_dir} ({meta.kind}) -> {out}" + (" with STS calibration" if calibration else ""))


def _run_settings(run_dir: str) -> dict:
    """The resolved config.yaml a train run left, as plain dicts ({} if absent)."""
    from omegaconf import OmegaConf

    path = Path(run_dir) / "config.yaml"
    return OmegaConf.to_container(OmegaConf.load(path)) if path.exists() else {}


def calibrate_parser() -> tuple[argparse.ArgumentParser, Flags]:
    from splitserve.config import CalibrateCommand, ModelsConfig

    p = argparse.ArgumentParser(prog="splitserve calibrate",
                                description="Fit per-position STS temperatures for a draft's confidence head.")
    f = Flags(p)
    f.add(CalibrateCommand, "run_dir")
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
    f.add(ModelsConfig, "device", "--device")
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

    p = argparse.ArgumentParser(prog="splitserve report",
                                description="Summarise the runs of a sweep: report.md table and PNG plots.")
    f = Flags(p)
    f.add(ReportCommand, "sweep_dir")
    f.add(ReportCommand, "wandb", "--wandb", action="store_true",
          help="also log the table and plots to wandb (offline by default)")
    f.add(ReportCommand, "wandb_project", "--wandb-project")
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


def gen_parser() -> tuple[argparse.ArgumentParser, Flags]:
    from splitserve.config import EndpointConfig, GenConfig, RemoteOptions

    p = argparse.ArgumentParser(
        prog="splitserve gen",
        description="Regenerate every assistant turn of a chat JSONL with the target itself (resumable).",
    )
    f = Flags(p)
    f.add(GenConfig, "data", "--data",
          help="chat data: JSONL/JSON/Parquet/Arrow, a save_to_disk directory or a glob (docs/data.md)")
    f.add(GenConfig, "out", "--out", required=True, help="output JSONL; appended to, and a rerun resumes it")
    f.add(GenConfig, "target", "--target", help="target name or HF directory")
    f.add(GenConfig, "target_name", "--target-name", help="name recorded in each row (default: the directory's)")
    f.add(GenConfig, "max_new_tokens", "--max-new-tokens", type=int, help="per reply")
    f.add(GenConfig, "temperature", "--temperature", type=float, help="0: greedy")
    f.add(GenConfig, "top_p", "--top-p", type=float)
    f.add(GenConfig, "top_k", "--top-k", type=int, help="0: off")
    f.add(GenConfig, "seed", "--seed", type=int)
    f.add(GenConfig, "batch_size", "--batch-size", type=int, help="conversations in flight (continuous) or per batch")
    f.add(GenConfig, "batching", "--batching", choices=("continuous", "static"),
          help="continuous: a finished conversation frees its slot at once; static: whole-batch turns "
               "(sampled runs reproducible row by row)")
    f.add(GenConfig, "max_rows", "--max-rows", type=int, help="read only the first N input rows")
    f.add(GenConfig, "max_turns", "--max-turns", type=int, help="replies per conversation (default: every user turn)")
    f.add(GenConfig, "max_length", "--max-length", type=int, help="no reply to a prompt this many tokens long")
    f.add(GenConfig, "device", "--device")
    f.add(GenConfig, "dtype", "--dtype")
    f.add(GenConfig, "chat_template", "--chat-template", metavar="FILE",
          help="Jinja file replacing the target's chat template (in-process runs)")
    f.add(GenConfig, "chat_template_kwargs", "--chat-template-kwargs", type=json_object, metavar="JSON",
          help='handed to the chat template (in-process, or sent to the servers), '
               'e.g. \'{"enable_thinking": false}\'')
    remote = p.add_argument_group("through OpenAI-compatible servers (SGLang, vLLM, splitserve serve)")
    f.add(EndpointConfig, "urls", "--endpoint", group=remote, action="append", default=[], metavar="URL",
          help="server root, e.g. http://host:30000 (repeat for several; requests go round-robin)")
    f.add(EndpointConfig, "concurrency", "--concurrency", group=remote, type=int,
          help="requests in flight per endpoint")
    f.add(EndpointConfig, "timeout_s", "--request-timeout", group=remote, type=float, metavar="REQUEST_TIMEOUT",
          help="seconds per request")
    f.add(EndpointConfig, "retries", "--retries", group=remote, type=int,
          help="per request, on timeouts, dropped connections, 5xx")
    f.add(RemoteOptions, "num_samples", "--num-samples", group=remote, type=int,
          help="sampled replies per conversation, a row each")
    f.add(RemoteOptions, "reasoning", "--reasoning", group=remote, choices=("keep", "drop"),
          help="keep the server's reasoning_content in the assistant message, or drop it")
    f.add(EndpointConfig, "api_key", "--api-key", group=remote, default=os.environ.get("OPENAI_API_KEY"),
          help="bearer token (default: $OPENAI_API_KEY)")
    return p, f


def gen_main(argv: list[str]) -> None:
    p, f = gen_parser()
    args = p.parse_args(argv)
    from splitserve.config import EndpointConfig, GenConfig, RemoteOptions
    from splitserve.data import DataError
    from splitserve.data.gen import run_gen

    cfg = f.build(GenConfig, args)
    opts = None
    if args.urls:
        opts = f.build(RemoteOptions, args, endpoint=f.build(EndpointConfig, args))
    elif args.num_samples != RemoteOptions.num_samples:
        p.error("--num-samples is for --endpoint runs")
    try:
        cfg.check()
        if opts is not None:
            opts.check(cfg)
    except ValueError as e:
        p.error(str(e))
    try:
        if opts is not None:
            from splitserve.data.endpoint import RequestFailed
            from splitserve.data.gen_remote import run_gen_remote

            try:
                summary = run_gen_remote(cfg, opts)
            except RequestFailed as e:
                sys.exit(f"splitserve gen: {e}")
        else:
            summary = run_gen(cfg)
    except DataError as e:
        sys.exit(f"splitserve gen: {e}")
    print(summary.format())


def _models_args(f: Flags) -> None:
    from splitserve.config import EngineConfig, ModelsConfig  # dataclasses only: cheap to import

    f.add(ModelsConfig, "draft", "--draft", required=True,
          help="exported draft directory (or a training run directory)")
    f.add(ModelsConfig, "target", "--target", help="target name or HF directory (default: the draft run's own)")
    f.add(ModelsConfig, "device", "--device")
    f.add(ModelsConfig, "dtype", "--dtype", help="auto (bfloat16 on CUDA, float32 elsewhere) | float32 | bfloat16")
    f.hub()
    f.add(EngineConfig, "max_context", "--max-model-len", "--max-context", type=int,
          help="prompt + generated tokens per request (vLLM's name; --max-context is the old one)")
    f.add(EngineConfig, "use_cuda_graphs", "--no-cuda-graphs", action="store_false",
          help="run the round eagerly on CUDA too")
    f.add(EngineConfig, "verify_kernel", "--verify-kernel", choices=["auto", "torch"])
    f.add(EngineConfig, "compile_backend", "--compile", action="store_const", const="inductor",
          help="torch.compile the round and the AR step (inductor) before graph capture")
    f.add(EngineConfig, "verify_schedule", "--verify-schedule", choices=["static", "confidence"],
          help="confidence: verify only the prefix the draft's calibrated confidences pay for")
    f.add(EngineConfig, "min_window", "--min-window", type=int,
          help="attend to the first W cache slots only, W = min-window * 2^k covering the request "
               "(one CUDA graph per W); 0: the whole --max-context every step")
    f.add(EngineConfig, "markov_topk", "--markov-topk", type=int,
          help="greedy rounds: run the Markov stage over each position's K best backbone candidates "
               "(output unchanged, τ may drop); 0: the exact stage over the whole vocab")


def serve_parser() -> tuple[argparse.ArgumentParser, Flags]:
    from splitserve.config import EngineConfig, ServerConfig

    p = argparse.ArgumentParser(prog="splitserve serve", description="OpenAI-compatible speculative server "
                                "(flags named as vLLM's where vLLM has one; docs/serving.md).")
    f = Flags(p)
    _models_args(f)
    f.add(ServerConfig, "host", "--host", help="address to listen on (vLLM's default is every interface)")
    f.add(ServerConfig, "port", "--port", type=int)
    f.add(ServerConfig, "served_model_name", "--served-model-name", "--model-name",
          help="model id in /v1/models and the only accepted 'model' (default: the target's name)")
    f.add(ServerConfig, "api_key", "--api-key", help="require 'Authorization: Bearer KEY' on /v1/* (401 otherwise)")
    f.add(ServerConfig, "chat_template", "--chat-template", metavar="FILE",
          help="Jinja chat template file used instead of the tokenizer's")
    f.add(EngineConfig, "seed", "--seed", type=int, help="generator seed for sampled requests without a seed")
    f.add(ServerConfig, "max_queue", "--max-queue", type=int, help="waiting requests beyond this get 503")
    f.add(ServerConfig, "request_timeout_s", "--request-timeout", type=float, metavar="REQUEST_TIMEOUT",
          help="seconds for a request body to arrive (408 after)")
    f.add(ServerConfig, "keep_alive_s", "--timeout-keep-alive", type=float, metavar="TIMEOUT_KEEP_ALIVE",
          help="seconds an idle keep-alive connection stays open (uvicorn's name)")
    f.add(ServerConfig, "ignore_fields", "--ignore-field", action="append", convert=tuple, metavar="NAME",
          help="accept this request field and ignore it instead of refusing it with 400 (repeatable)")
    return p, f


def serve_main(argv: list[str]) -> None:
    p, f = serve_parser()
    args = p.parse_args(argv)
    from splitserve.config import EngineConfig, ModelsConfig, ServerConfig
    from splitserve.errors import UserError
    from splitserve.models.build import DraftMismatchError
    from splitserve.serve.app import run_server

    models, engine, server = (f.build(c, args) for c in (ModelsConfig, EngineConfig, ServerConfig))
    meta = draft_meta(models.draft, "--draft")
    try:
        run_server(models, engine, server, meta)
    except DraftMismatchError as exc:
        raise UserError(f"refusing to start: {exc}") from None


def bench_parser() -> tuple[argparse.ArgumentParser, Flags]:
    from splitserve.config import BenchConfig

    p = argparse.ArgumentParser(prog="splitserve bench", description="Batch-1 latency on synthetic prompts.")
    f = Flags(p)
    _models_args(f)
    f.add(BenchConfig, "input_len", "--input-len", type=int)
    f.add(BenchConfig, "output_len", "--output-len", type=int)
    f.add(BenchConfig, "num_requests", "--num-requests", type=int)
    f.add(BenchConfig, "prompts", "--prompts",
          help="chat prompts (JSONL, or 'chitchat' for the held-out set) instead of synthetic ones; "
               "replies stop at EOS or after --output-len tokens")
    f.add(BenchConfig, "warmup", "--warmup", type=int)
    f.add(BenchConfig, "seed", "--seed", type=int)
    f.add(BenchConfig, "baseline", "--baseline", action="store_true",
          help="also engine AR, transformers generate and assisted")
    f.add(BenchConfig, "assistant", "--assistant", help="same-tokenizer small causal LM for assisted generation")
    f.add(BenchConfig, "json_out", "--json", help="write the report here")
    return p, f


def bench_main(argv: list[str]) -> None:
    p, f = bench_parser()
    args = p.parse_args(argv)
    from splitserve.config import BenchConfig, EngineConfig, ModelsConfig
    from splitserve.evaluation.bench import run_bench
    from splitserve.models.build import DraftMismatchError

    models, engine, cfg = (f.build(c, args) for c in (ModelsConfig, EngineConfig, BenchConfig))
    meta = draft_meta(models.draft, "--draft")
    try:
        run_bench(models, engine, cfg, meta=meta)
    except DraftMismatchError as exc:
        sys.exit(f"splitserve bench: {exc}")


PARSERS = {"eval": eval_parser, "export": export_parser, "gen": gen_parser, "calibrate": calibrate_parser,
           "report": report_parser, "serve": serve_parser, "bench": bench_parser}


COMMANDS = {"eval": eval_main, "export": export_main, "gen": gen_main, "calibrate": calibrate_main,
            "report": report_main, "serve": serve_main, "bench": bench_main}  # train and dump go through Hydra


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = DEBUG_FLAG in argv
    argv = [a for a in argv if a != DEBUG_FLAG]
    if not argv or argv[0] in ("-h", "--help", "help"):
        print("usage:\n" + USAGE)
        return
    cmd, rest = argv[0], argv[1:]
    if cmd not in COMMANDS and cmd not in ("train", "dump"):
        sys.exit(f"splitserve: unknown command {cmd!r}\nusage:\n{USAGE}")
    try:
        if cmd in ("train", "dump"):
            hydra_app(cmd, rest)
        else:
            COMMANDS[cmd](rest)
    except user_error_types() as exc:
        if debug:
            raise
        from splitserve.errors import one_line

        sys.exit(f"splitserve {cmd}: {one_line(exc)}")


if __name__ == "__main__":
    main()
