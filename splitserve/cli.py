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
sweeps work); the other commands take plain flags. A user error (a bad file, row, flag, port or
draft) prints one line and exits 1; `--debug` anywhere on the line shows its traceback instead.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from splitserve.checks import check_export_dir, check_prompts, check_train_data, draft_meta, user_error_types

USAGE = __doc__.split("\n\n")[1]
DEBUG_FLAG = "--debug"


PACKAGE_CONF = Path(__file__).resolve().parent / "conf"  # package data: ships in the wheel


def conf_dir() -> Path:
    """The Hydra config tree: the package's own, or SPLITSERVE_CONF to use a copy of it."""
    env = os.environ.get("SPLITSERVE_CONF")
    path = Path(env) if env else PACKAGE_CONF
    if not (path / "config.yaml").exists():
        sys.exit(f"splitserve: no Hydra config at {path} (SPLITSERVE_CONF must name a directory holding config.yaml)")
    return path


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


def add_hub_args(p: argparse.ArgumentParser) -> None:
    """--revision / --trust-remote-code for every command that loads the target (train and
    dump take them as target.revision / target.trust_remote_code)."""
    p.add_argument("--revision", default=None, help="a branch, tag or commit of a hub target (from_pretrained)")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="run the target's own modelling code from its directory (from_pretrained)")


def hub_kw(args) -> dict:
    return {"revision": args.revision, "trust_remote_code": args.trust_remote_code}


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


def eval_main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="splitserve eval", description="Measure a draft by speculative decoding.")
    p.add_argument("--draft", required=True, help="run directory or exported draft directory")
    p.add_argument("--target", default=None, help="target name or HF directory (default: the draft's own)")
    p.add_argument("--prompts", default="chitchat", help="chat JSONL ({messages} or {prompt} lines)")
    p.add_argument("--num-prompts", type=int, default=None)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--compare-untrained", action="store_true", help="also evaluate a freshly initialised draft")
    p.add_argument("--json", action="store_true", help="print the full report as JSON")
    p.add_argument("--chat-template", default=None, metavar="FILE",
                   help="Jinja file replacing the target's chat template (as data.chat_template in training)")
    p.add_argument("--chat-template-kwargs", default=None, metavar="JSON",
                   help='handed to the chat template, e.g. \'{"enable_thinking": false}\'')
    add_hub_args(p)
    args = p.parse_args(argv)

    from splitserve.config import TargetConfig
    from splitserve.evaluation.evaluate import evaluate, format_reports
    from splitserve.evaluation.heldout import load_prompt_ids
    from splitserve.loading import load_draft
    from splitserve.models.build import build_draft, check_compatible
    from splitserve.target.hf import load_hf_target, peek_target_info

    arch, _, run_target = draft_meta(args.draft, "--draft")
    check_prompts(args.prompts, "--prompts")
    target_path = args.target or run_target or "smollm2-135m"
    tcfg = TargetConfig(name=Path(target_path).name, path=target_path, dtype=args.dtype, device=args.device,
                        layer_ids=list(arch.target_layer_ids), **hub_kw(args))
    # Refuse a draft made for another target before loading any weights.
    check_compatible(arch, peek_target_info(tcfg), where=f"draft {args.draft}")
    target = load_hf_target(tcfg)
    draft = load_draft(args.draft, target)
    from splitserve.data import ChatTemplate, DataError

    try:
        kwargs = json.loads(args.chat_template_kwargs) if args.chat_template_kwargs else None
        prompts = load_prompt_ids(args.prompts, target.tokenizer, args.num_prompts,
                                  ChatTemplate.load(args.chat_template, kwargs))
    except (json.JSONDecodeError, DataError) as e:
        sys.exit(f"splitserve eval: {e}")
    eos = target.eos_ids()
    reports = {"draft": evaluate(target, draft, prompts, args.max_new_tokens, args.temperature, args.seed, eos_ids=eos)}
    if args.compare_untrained:
        import torch

        torch.manual_seed(args.seed)
        reports["untrained"] = evaluate(target, build_draft(arch, target).to(target.dtype).eval(), prompts,
                                        args.max_new_tokens, args.temperature, args.seed, eos_ids=eos)
    if args.json:
        print(json.dumps({k: r.to_dict() for k, r in reports.items()}, indent=1))
    else:
        print(format_reports(reports))


def export_main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="splitserve export", description="Export a trained draft as an HF checkpoint "
                                "(default), as the speculators checkpoint vLLM serves (--format speculators), "
                                "or as the checkpoint SGLang's DSPARK loader reads (--format sglang).")
    p.add_argument("run_dir")
    p.add_argument("out_dir")
    p.add_argument("--target", default=None, help="target name or HF directory (default: the run's own)")
    p.add_argument("--format", choices=["hf", "speculators", "sglang"], default="hf",
                   help="checkpoint layout (default: hf; docs/deploy.md)")
    p.add_argument("--algorithm", choices=["dspark", "dflash"], default=None,
                   help="sglang format: dspark (the default); dflash is refused, see docs/deploy.md")
    p.add_argument("--keep-fp32", action="store_true",
                   help="speculators format: keep float32 weights (default: bfloat16); refused for sglang")
    p.add_argument("--force", action="store_true", help="replace OUT_DIR if it exists and is not empty")
    add_hub_args(p)
    args = p.parse_args(argv)
    if args.format == "sglang" and (args.keep_fp32 or args.algorithm == "dflash"):
        from splitserve.export.sglang import refuse_options

        refuse_options(args.algorithm, args.keep_fp32)
    out_dir = check_export_dir(args.out_dir, args.force)

    from splitserve.config import TargetConfig
    from splitserve.export import export_draft
    from splitserve.loading import load_draft
    from splitserve.speculative.calibration_file import load_calibration
    from splitserve.target.shared_weights import SharedWeightsTarget

    arch, kind, run_target = draft_meta(args.run_dir, "RUN_DIR")
    target_path = args.target or run_target or "smollm2-135m"
    # An export needs of the target only its embedding and lm_head: two tensors, not the model.
    target = SharedWeightsTarget(TargetConfig(name=arch.target_name or Path(target_path).name, path=target_path,
                                              layer_ids=list(arch.target_layer_ids), device="cpu", **hub_kw(args)))
    draft = load_draft(args.run_dir, target)
    calibration = load_calibration(args.run_dir)
    if out_dir.exists():  # --force: replaced whole, so no file of the old export survives
        import shutil

        shutil.rmtree(out_dir)
    text_cfg = target.config.get_text_config()
    max_pos = int(getattr(text_cfg, "max_position_embeddings", 32768))
    if args.format in ("speculators", "sglang"):
        from splitserve.assets import resolve_target_path

        served_target = str(Path(resolve_target_path(target_path)).resolve())  # what the server opens
    if args.format == "speculators":
        import torch

        from splitserve.export.speculators import export_speculators, vllm_command

        exp = export_speculators(draft, args.out_dir, served_target, list(target.config.architectures or []),
                                 target.info.hidden_size, max_pos, torch.float32 if args.keep_fp32 else torch.bfloat16)
        print(f"exported {args.run_dir} ({kind}) -> {exp.out_dir} in the speculators DSpark layout (vLLM)")
        try:
            print(vllm_command(exp, served_target))
        except ValueError as exc:
            print(f"note: {exc}")
        return
    if args.format == "sglang":
        from splitserve.export.sglang import export_sglang, launch_command

        exp = export_sglang(draft, args.out_dir, target.info.num_layers, calibration, max_pos)
        print(f"exported {args.run_dir} ({kind}) -> {exp.out_dir} for SGLang DSPARK")
        print(launch_command(exp, served_target))
        return
    out = export_draft(draft, args.out_dir, target.info, calibration)
    print(f"exported {args.run_dir} ({kind}) -> {out}" + (" with STS calibration" if calibration else ""))


def _run_settings(run_dir: str) -> dict:
    """The resolved config.yaml a train run left, as plain dicts ({} if absent)."""
    from omegaconf import OmegaConf

    path = Path(run_dir) / "config.yaml"
    return OmegaConf.to_container(OmegaConf.load(path)) if path.exists() else {}


def calibrate_main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="splitserve calibrate",
                                description="Fit per-position STS temperatures for a draft's confidence head.")
    p.add_argument("run_dir")
    p.add_argument("--target", default=None, help="target name or HF directory (default: the run's own)")
    p.add_argument("--prompts", default=None, help="held-out chat JSONL (default: the run's data.heldout_prompts)")
    p.add_argument("--num-prompts", type=int, default=None, help="default: the run's eval.num_prompts")
    p.add_argument("--max-new-tokens", type=int, default=None, help="default: the run's eval.max_new_tokens")
    p.add_argument("--temperature", type=float, action="append", default=None,
                   help="sampling temperature to calibrate at (repeatable; default: the run's eval temperature)")
    p.add_argument("--bins", type=int, default=None, help="ECE bins (default: the run's eval.calibration_bins or 10)")
    p.add_argument("--device", default="auto")
    add_hub_args(p)
    args = p.parse_args(argv)

    from splitserve.config import TargetConfig
    from splitserve.evaluation.calibration import calibrate_run, format_fit
    from splitserve.evaluation.heldout import load_prompt_ids
    from splitserve.loading import load_draft
    from splitserve.target.hf import load_hf_target

    run = _run_settings(args.run_dir)
    ev, data = run.get("eval", {}), run.get("data", {})
    arch, _, run_target = draft_meta(args.run_dir, "RUN_DIR")
    target_path = args.target or run_target or "smollm2-135m"
    target = load_hf_target(TargetConfig(name=arch.target_name or Path(target_path).name, path=target_path,
                                         layer_ids=list(arch.target_layer_ids), device=args.device, **hub_kw(args)))
    draft = load_draft(args.run_dir, target)
    prompts_from = args.prompts or data.get("heldout_prompts", "chitchat")
    from splitserve.data import ChatTemplate

    # Rendered as the run trained and evaluated them.
    chat = ChatTemplate.load(data.get("chat_template"), data.get("chat_template_kwargs"))
    prompts = load_prompt_ids(prompts_from, target.tokenizer, args.num_prompts or ev.get("num_prompts", 20), chat)
    fits = calibrate_run(args.run_dir, target, draft, prompts,
                         args.temperature or [ev.get("temperature", 0.0)],
                         args.max_new_tokens or ev.get("max_new_tokens", 64),
                         seed=run.get("train", {}).get("seed", 0), n_bins=args.bins or ev.get("calibration_bins", 10),
                         eos_ids=target.eos_ids(), source=f"{len(prompts)} prompts from {prompts_from}")
    print("\n".join(format_fit(f) for f in fits))
    print(f"wrote {Path(args.run_dir) / 'calibration.json'}")


def report_main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="splitserve report",
                                description="Summarise the runs of a sweep: report.md table and PNG plots.")
    p.add_argument("sweep_dir")
    p.add_argument("--wandb", action="store_true", help="also log the table and plots to wandb (offline by default)")
    p.add_argument("--wandb-project", default="splitserve")
    args = p.parse_args(argv)

    from splitserve.evaluation.report import write_report

    try:
        path = write_report(args.sweep_dir, wandb=args.wandb, wandb_project=args.wandb_project)
    except FileNotFoundError as exc:
        sys.exit(f"splitserve report: {exc}")
    print(path.read_text())


def gen_main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(
        prog="splitserve gen",
        description="Regenerate every assistant turn of a chat JSONL with the target itself (resumable).",
    )
    p.add_argument("--data", default="chitchat",
                   help="chat data: JSONL/JSON/Parquet/Arrow, a save_to_disk directory or a glob (docs/data.md)")
    p.add_argument("--out", required=True, help="output JSONL; appended to, and a rerun resumes it")
    p.add_argument("--target", default="smollm2-135m", help="target name or HF directory")
    p.add_argument("--target-name", default=None, help="name recorded in each row (default: the directory's)")
    p.add_argument("--max-new-tokens", type=int, default=256, help="per reply")
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0, help="0: off")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=8, help="conversations in flight (continuous) or per batch")
    p.add_argument("--batching", choices=("continuous", "static"), default="continuous",
                   help="continuous: a finished conversation frees its slot at once; static: whole-batch turns "
                        "(sampled runs reproducible row by row)")
    p.add_argument("--max-rows", type=int, default=None, help="read only the first N input rows")
    p.add_argument("--max-turns", type=int, default=None, help="replies per conversation (default: every user turn)")
    p.add_argument("--max-length", type=int, default=1024, help="no reply to a prompt this many tokens long")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--chat-template", default=None, metavar="FILE",
                   help="Jinja file replacing the target's chat template (in-process runs)")
    p.add_argument("--chat-template-kwargs", default=None, metavar="JSON",
                   help='handed to the chat template (in-process, or sent to the servers), '
                        'e.g. \'{"enable_thinking": false}\'')
    remote = p.add_argument_group("through OpenAI-compatible servers (SGLang, vLLM, splitserve serve)")
    remote.add_argument("--endpoint", action="append", default=[], metavar="URL",
                        help="server root, e.g. http://host:30000 (repeat for several; requests go round-robin)")
    remote.add_argument("--concurrency", type=int, default=32, help="requests in flight per endpoint")
    remote.add_argument("--request-timeout", type=float, default=600.0, help="seconds per request")
    remote.add_argument("--retries", type=int, default=5, help="per request, on timeouts, dropped connections, 5xx")
    remote.add_argument("--num-samples", type=int, default=1, help="sampled replies per conversation, a row each")
    remote.add_argument("--reasoning", choices=("keep", "drop"), default="keep",
                        help="keep the server's reasoning_content in the assistant message, or drop it")
    remote.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"),
                        help="bearer token (default: $OPENAI_API_KEY)")
    args = p.parse_args(argv)

    from splitserve.data import DataError
    from splitserve.data.gen import config_from_args, run_gen

    try:
        args.chat_template_kwargs = json.loads(args.chat_template_kwargs) if args.chat_template_kwargs else None
    except json.JSONDecodeError as e:
        p.error(f"--chat-template-kwargs is not JSON: {e}")
    if args.chat_template_kwargs is not None and not isinstance(args.chat_template_kwargs, dict):
        p.error("--chat-template-kwargs must be a JSON object")
    cfg = config_from_args(args)
    opts = None
    if args.endpoint:
        from splitserve.data.endpoint import EndpointConfig
        from splitserve.data.gen_remote import RemoteOptions

        opts = RemoteOptions(EndpointConfig(args.endpoint, args.concurrency, args.request_timeout, args.retries,
                                            api_key=args.api_key),
                             num_samples=args.num_samples, reasoning=args.reasoning)
    elif args.num_samples != 1:
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


def _models_args(p: argparse.ArgumentParser) -> None:
    from splitserve.config import EngineConfig  # dataclasses only: cheap to import

    p.add_argument("--draft", required=True, help="exported draft directory (or a training run directory)")
    p.add_argument("--target", default=None, help="target name or HF directory (default: the draft run's own)")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto", help="auto (bfloat16 on CUDA, float32 elsewhere) | float32 | bfloat16")
    add_hub_args(p)
    p.add_argument("--max-model-len", "--max-context", dest="max_context", type=int, default=4096,
                   help="prompt + generated tokens per request (vLLM's name; --max-context is the old one)")
    p.add_argument("--no-cuda-graphs", action="store_true", help="run the round eagerly on CUDA too")
    p.add_argument("--verify-kernel", default="auto", choices=["auto", "torch"])
    p.add_argument("--compile", action="store_true",
                   help="torch.compile the round and the AR step (inductor) before graph capture")
    p.add_argument("--verify-schedule", default="static", choices=["static", "confidence"],
                   help="confidence: verify only the prefix the draft's calibrated confidences pay for")
    p.add_argument("--min-window", type=int, default=EngineConfig.min_window,
                   help="attend to the first W cache slots only, W = min-window * 2^k covering the request "
                        "(one CUDA graph per W); 0: the whole --max-context every step")
    p.add_argument("--markov-topk", type=int, default=EngineConfig.markov_topk,
                   help="greedy rounds: run the Markov stage over each position's K best backbone candidates "
                        "(output unchanged, τ may drop); 0: the exact stage over the whole vocab")


def _models_and_engine(args):
    from splitserve.config import EngineConfig, ModelsConfig

    return (ModelsConfig(draft=args.draft, target=args.target, device=args.device, dtype=args.dtype, **hub_kw(args)),
            EngineConfig(max_context=args.max_context, use_cuda_graphs=not args.no_cuda_graphs,
                         verify_kernel=args.verify_kernel, verify_schedule=args.verify_schedule,
                         compile_backend="inductor" if args.compile else None, min_window=args.min_window,
                         markov_topk=args.markov_topk))


def serve_main(argv: list[str]) -> None:
    from splitserve.config import ServerConfig

    d = ServerConfig()
    p = argparse.ArgumentParser(prog="splitserve serve", description="OpenAI-compatible speculative server "
                                "(flags named as vLLM's where vLLM has one; docs/serving.md).")
    _models_args(p)
    p.add_argument("--host", default=d.host, help="address to listen on (vLLM's default is every interface)")
    p.add_argument("--port", type=int, default=d.port)
    p.add_argument("--served-model-name", "--model-name", dest="served_model_name", default=None,
                   help="model id in /v1/models and the only accepted 'model' (default: the target's name)")
    p.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on /v1/* (401 otherwise)")
    p.add_argument("--chat-template", default=None, metavar="FILE",
                   help="Jinja chat template file used instead of the tokenizer's")
    p.add_argument("--seed", type=int, default=0, help="generator seed for sampled requests without a seed")
    p.add_argument("--max-queue", type=int, default=d.max_queue, help="waiting requests beyond this get 503")
    p.add_argument("--request-timeout", type=float, default=d.request_timeout_s,
                   help="seconds for a request body to arrive (408 after)")
    p.add_argument("--timeout-keep-alive", type=float, default=d.keep_alive_s,
                   help="seconds an idle keep-alive connection stays open (uvicorn's name)")
    p.add_argument("--ignore-field", action="append", default=[], metavar="NAME",
                   help="accept this request field and ignore it instead of refusing it with 400 (repeatable)")
    args = p.parse_args(argv)

    from splitserve.errors import UserError
    from splitserve.models.build import DraftMismatchError
    from splitserve.serve.app import run_server

    draft_meta(args.draft, "--draft")
    models, engine = _models_and_engine(args)
    engine.seed = args.seed
    server = ServerConfig(host=args.host, port=args.port, served_model_name=args.served_model_name,
                          api_key=args.api_key, chat_template=args.chat_template, max_queue=args.max_queue,
                          request_timeout_s=args.request_timeout, keep_alive_s=args.timeout_keep_alive,
                          ignore_fields=tuple(args.ignore_field))
    try:
        run_server(models, engine, server)
    except DraftMismatchError as exc:
        raise UserError(f"refusing to start: {exc}") from None


def bench_main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="splitserve bench", description="Batch-1 latency on synthetic prompts.")
    _models_args(p)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--num-requests", type=int, default=10)
    p.add_argument("--prompts", default=None,
                   help="chat prompts (JSONL, or 'chitchat' for the held-out set) instead of synthetic ones; "
                        "replies stop at EOS or after --output-len tokens")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--baseline", action="store_true", help="also engine AR, transformers generate and assisted")
    p.add_argument("--assistant", default=None, help="same-tokenizer small causal LM for assisted generation")
    p.add_argument("--json", dest="json_out", default=None, help="write the report here")
    args = p.parse_args(argv)

    from splitserve.config import BenchConfig
    from splitserve.evaluation.bench import run_bench
    from splitserve.models.build import DraftMismatchError

    models, engine = _models_and_engine(args)
    cfg = BenchConfig(input_len=args.input_len, output_len=args.output_len, num_requests=args.num_requests,
                      prompts=args.prompts, warmup=args.warmup, seed=args.seed, baseline=args.baseline,
                      assistant=args.assistant, json_out=args.json_out)
    try:
        run_bench(models, engine, cfg)
    except DraftMismatchError as exc:
        sys.exit(f"splitserve bench: {exc}")


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
