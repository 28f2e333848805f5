"""The `splitserve` console script. Entry points stay thin: parse, build, run, close.

    splitserve train  [hydra overrides]   distil a draft, then evaluate it on held-out prompts
    splitserve dump   [hydra overrides]   store the target's hidden states for offline training
    splitserve eval   --draft D [...]     speculative decoding against the real target
    splitserve export RUN_DIR OUT_DIR     Hugging Face checkpoint of a trained draft

`train` and `dump` are Hydra apps over `conf/` (so `-m` multirun sweeps work); `eval` and
`export` take plain flags.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

USAGE = __doc__.split("\n\n")[1]


def conf_dir() -> Path:
    env = os.environ.get("SPLITSERVE_CONF")
    path = Path(env) if env else Path(__file__).resolve().parents[1] / "conf"
    if not (path / "config.yaml").exists():
        sys.exit(f"splitserve: no Hydra config at {path} (set SPLITSERVE_CONF or install with pip install -e .)")
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


def hydra_app(command: str, argv: list[str]) -> None:
    import hydra

    _register_schema()

    @hydra.main(config_path=str(conf_dir()), config_name="config", version_base="1.3")
    def app(dcfg) -> None:
        cfg = to_run_config(dcfg)
        if command == "train":
            from splitserve.train.heldout import evaluate_run
            from splitserve.train.loop import train

            _save_resolved(cfg, Path(cfg.run_dir))
            result = train(cfg)
            if cfg.eval.enabled:
                evaluate_run(cfg, result.target, result.draft)
        else:
            from splitserve.offline.capture import run_dump

            _save_resolved(cfg, Path(cfg.dump.out_dir))
            run_dump(cfg)

    sys.argv = [f"splitserve {command}", *argv]
    app()


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
    args = p.parse_args(argv)

    from splitserve.config import TargetConfig
    from splitserve.models.build import build_draft, check_compatible
    from splitserve.models.io import load_draft, read_draft_meta
    from splitserve.spec.evaluate import evaluate, format_reports
    from splitserve.target.hf import load_hf_target, peek_target_info
    from splitserve.train.heldout import eos_ids_of, load_prompt_ids

    arch, _, run_target = read_draft_meta(args.draft)
    target_path = args.target or run_target or "smollm2-135m"
    tcfg = TargetConfig(name=Path(target_path).name, path=target_path, dtype=args.dtype, device=args.device,
                        layer_ids=list(arch.target_layer_ids))
    # Refuse a draft made for another target before loading any weights.
    check_compatible(arch, peek_target_info(tcfg), where=f"draft {args.draft}")
    target = load_hf_target(tcfg)
    draft = load_draft(args.draft, target)
    prompts = load_prompt_ids(args.prompts, target.tokenizer, args.num_prompts)
    eos = eos_ids_of(target.tokenizer)
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
    p = argparse.ArgumentParser(prog="splitserve export", description="Export a trained draft as an HF checkpoint.")
    p.add_argument("run_dir")
    p.add_argument("out_dir")
    p.add_argument("--target", default=None, help="target name or HF directory (default: the run's own)")
    args = p.parse_args(argv)

    from splitserve.config import TargetConfig
    from splitserve.export import export_draft
    from splitserve.models.io import load_draft, read_draft_meta
    from splitserve.target.hf import load_hf_target

    arch, kind, run_target = read_draft_meta(args.run_dir)
    target_path = args.target or run_target or "smollm2-135m"
    target = load_hf_target(TargetConfig(name=arch.target_name or Path(target_path).name, path=target_path,
                                         layer_ids=list(arch.target_layer_ids), device="cpu"))
    draft = load_draft(args.run_dir, target)
    out = export_draft(draft, args.out_dir, target.info)
    print(f"exported {args.run_dir} ({kind}) -> {out}")


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print("usage:\n" + USAGE)
        return
    cmd, rest = argv[0], argv[1:]
    if cmd in ("train", "dump"):
        hydra_app(cmd, rest)
    elif cmd == "eval":
        eval_main(rest)
    elif cmd == "export":
        export_main(rest)
    else:
        sys.exit(f"splitserve: unknown command {cmd!r}\nusage:\n{USAGE}")


if __name__ == "__main__":
    main()
