"""`splitserve train --help` (and `dump --help`): the config groups and their options, one line
each, read from the package's conf/ so the list cannot drift from what Hydra composes."""

from __future__ import annotations

from pathlib import Path

INTRO = """usage: splitserve {command} [group=option ...] [field=value ...] [-m]

{what}

Config groups (pick one option each: `draft=dspark_b16`; the default is marked *):
"""
WHAT = {
    "train": "Distil a draft from the target, checkpointing as it goes (the same command resumes), then "
             "evaluate it on held-out prompts (eval.json, eval.md in the run directory).",
    "dump": "Run the target once over the data and store its hidden states (dump.out_dir=DIR) for "
            "offline training (data.dump_dir=DIR).",
}
OUTRO = """
Any field is a dot-override: target.path=/models/Qwen3-8B train.max_steps=2000 draft.num_layers=3.
-m runs a sweep over comma-separated values (draft=dspark_b8,dflash_b8), as Hydra's multirun.
The full tree with every field and its value: splitserve {command} --cfg job
Fields and what they mean: splitserve/config/run.py; guides: docs/ (losses.md, data.md, split-training.md).
"""


def describe(path: Path) -> str:
    """The first sentence of an option file's opening comment (Hydra directives skipped)."""
    words: list[str] = []
    for line in path.read_text().splitlines():
        text = line.strip()
        if text.startswith("# @"):
            continue
        if not text.startswith("#") or (words and text.lstrip("# ").startswith("splitserve ")):
            break
        words += text.lstrip("#").split()
        joined = " ".join(words)
        if ". " in joined or joined.endswith("."):
            break
    joined = " ".join(words)
    return joined.split(". ")[0].rstrip(".") if joined else ""


def defaults(conf: Path) -> dict[str, str]:
    """group -> default option, from config.yaml's defaults list."""
    import yaml

    out = {}
    for item in yaml.safe_load((conf / "config.yaml").read_text()).get("defaults", []):
        if isinstance(item, dict):
            out.update({str(k): str(v) for k, v in item.items()})
    return out


def groups(conf: Path) -> dict[str, list[tuple[str, str]]]:
    """group -> [(option, one-line description)], sorted."""
    return {d.name: [(f.stem, describe(f)) for f in sorted(d.glob("*.yaml"))]
            for d in sorted(conf.iterdir()) if d.is_dir()}


def train_help(command: str, conf: Path) -> str:
    chosen = defaults(conf)
    lines = [INTRO.format(command=command, what=WHAT[command])]
    for group, options in groups(conf).items():
        lines.append(f"  {group}:")
        width = max(len(o) for o, _ in options) + 2
        for option, text in options:
            mark = "*" if chosen.get(group) == option else " "
            lines.append(f"   {mark}{option:<{width}}{text}")
    lines.append(OUTRO.format(command=command))
    return "\n".join(lines)
