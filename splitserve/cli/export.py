"""`splitserve export RUN_DIR OUT_DIR`: a draft for transformers, vLLM (speculators) or SGLang."""

from __future__ import annotations

import argparse
from pathlib import Path

from splitserve.checks import check_export_dir, draft_meta
from splitserve.cli.flags import Flags, new_parser
from splitserve.errors import UserError


def export_parser() -> tuple[argparse.ArgumentParser, Flags]:
    from splitserve.config import ExportCommand, ModelsConfig

    p = new_parser(prog="splitserve export", description="Export a trained draft as an HF checkpoint "
                                "(default), as the speculators checkpoint vLLM serves (--format speculators), "
                                "or as the checkpoint SGLang's DSPARK loader reads (--format sglang). An EAGLE-3 "
                                "draft exports as speculators (vLLM eagle3) or sglang (SGLang EAGLE3) only.")
    f = Flags(p)
    f.add(ExportCommand, "run_dir", help="a training run directory (its newest checkpoint) or an exported draft")
    f.add(ExportCommand, "out_dir", help="where the checkpoint is written (refused if not empty, unless --force)")
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
    written = _arch_file(cmd.run_dir)
    family = written.get("family", "dspark") if written else None
    window = (written or {}).get("arch", {}).get("context_window", 0)
    if window:
        raise UserError(f"{cmd.run_dir} was trained with draft.context_window={window}: vLLM's and SGLang's DSpark "
                        "read the whole context, so served acceptance would differ from what was trained; serve it "
                        "with splitserve serve, or train without a window to export")
    if family == "mtp":
        raise UserError(f"{cmd.run_dir} is a draft=mtp run: its head is not exported yet (vLLM and SGLang serve a "
                        "target's own MTP head natively, docs/mtp.md)")
    eagle3 = family == "eagle3"
    if eagle3:  # its options are refused before anything loads, as DSpark's below
        from splitserve.export.eagle3 import refuse_options as refuse_eagle3_options

        refuse_eagle3_options(cmd.format, cmd.algorithm, cmd.keep_fp32)
    elif cmd.format == "sglang" and (cmd.keep_fp32 or cmd.algorithm == "dflash"):
        from splitserve.export.sglang import refuse_options

        refuse_options(cmd.algorithm, cmd.keep_fp32)
    out_dir = check_export_dir(cmd.out_dir, cmd.force, cmd.run_dir)

    from splitserve.export import export_draft
    from splitserve.loading import load_models, target_config_for
    from splitserve.speculative.calibration_file import load_calibration

    meta = draft_meta(cmd.run_dir, "RUN_DIR")
    # An export needs of the target only its embedding and lm_head: two tensors, not the model.
    models = f.build(ModelsConfig, args, draft=cmd.run_dir, device="cpu", dtype="float32")
    target, draft = load_models(models, meta, shared_weights_only=True)
    if not eagle3 and draft.arch.reduced and cmd.format in ("speculators", "sglang"):  # export_* expand it
        print(f"note: {cmd.format}'s DSpark has no draft vocabulary map, so the draft's "
              f"{draft.arch.draft_vocab_size:,}-token head is written over the target's whole "
              f"{draft.arch.vocab_size:,} tokens (its logits on its own tokens unchanged, the others from the "
              "backbone alone; docs/deploy.md)")
    calibration = load_calibration(cmd.run_dir)
    if out_dir.exists():  # --force: replaced whole, so no file of the old export survives
        import shutil

        shutil.rmtree(out_dir)
    text_cfg = target.config.get_text_config()
    max_pos = int(getattr(text_cfg, "max_position_embeddings", 32768))
    if cmd.format in ("speculators", "sglang"):
        from splitserve.assets import resolve_target_path
        from splitserve.export.engine_versions import checked_line

        # what the server opens
        served_target = str(Path(resolve_target_path(target_config_for(meta, models).path)).resolve())
    if eagle3:
        _export_eagle3(cmd, meta, draft, target, served_target, max_pos)
        return
    if cmd.format == "speculators":
        import torch

        from splitserve.export.speculators import export_speculators, vllm_command

        exp = export_speculators(draft, cmd.out_dir, served_target, list(target.config.architectures or []),
                                 target.info.hidden_size, max_pos, torch.float32 if cmd.keep_fp32 else torch.bfloat16,
                                 target_config=target.config)
        print(f"exported {cmd.run_dir} ({meta.kind}) -> {exp.out_dir} in the speculators DSpark layout (vLLM)")
        try:
            print(f"{checked_line('vllm')}\n{vllm_command(exp, served_target)}")
        except ValueError as exc:
            print(f"note: {exc}")
        _print_installed_warning("vllm")
        return
    if cmd.format == "sglang":
        from splitserve.export.sglang import export_sglang, launch_command

        exp = export_sglang(draft, cmd.out_dir, target.info.num_layers, calibration, max_pos,
                            target_config=target.config)
        print(f"exported {cmd.run_dir} ({meta.kind}) -> {exp.out_dir} for SGLang DSPARK")
        try:
            print(f"{checked_line('sglang')}\n{launch_command(exp, served_target)}")
        except ValueError as exc:  # a target SGLang cannot serve: one line, the files stay written
            print(f"note: {exc}")
        _print_installed_warning("sglang")
        return
    out = export_draft(draft, cmd.out_dir, target.info, calibration)
    print(f"exported {cmd.run_dir} ({meta.kind}) -> {out}" + (" with STS calibration" if calibration else ""))


def _arch_file(run_dir: str) -> dict | None:
    """A run directory's draft_arch.json read alone (no weights, no arch built): its family and
    arch fields; None for anything else: an export directory (DSpark's) or one refused later."""
    import json

    from splitserve.models.run_files import ARCH_FILE

    try:
        written = json.loads((Path(run_dir) / ARCH_FILE).read_text())
    except (OSError, ValueError):
        return None
    return written if isinstance(written, dict) else None


def _export_eagle3(cmd, meta, draft, target, served_target: str, max_pos: int) -> None:
    import torch

    from splitserve.export.eagle3 import ENGINE, LAYOUT_NAME, export_eagle3, serve_command, unchecked_target_note
    from splitserve.export.engine_versions import checked_line

    exp = export_eagle3(draft, cmd.out_dir, cmd.format, served_target, list(target.config.architectures or []),
                        max_pos, torch.float32 if cmd.keep_fp32 else torch.bfloat16)
    engine = ENGINE[cmd.format]
    print(f"exported {cmd.run_dir} ({meta.kind}) -> {exp.out_dir} in {LAYOUT_NAME[cmd.format]}; captured layers "
          f"{list(draft.arch.target_layer_ids)} written as {list(exp.layer_ids)}")
    print(f"{checked_line(engine, 'eagle3')}\n{serve_command(exp, served_target)}")
    note = unchecked_target_note(target.config)
    if note:
        print(note)
    _print_installed_warning(engine, "eagle3")


def _print_installed_warning(engine: str, family: str = "dspark") -> None:
    """One line when the engine installed here builds another draft block than the one checked
    (an EAGLE-3 export: when it is another release than the one checked)."""
    from splitserve.export.engine_versions import installed_warning

    line = installed_warning(engine, family)
    if line:
        print(line)
