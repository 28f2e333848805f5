"""Run the architecture matrix (tests/arch_matrix.py, the checks tests/test_target_matrix.py
asserts) and write its table into docs/targets.md, between the matrix markers.

    python bench/target_matrix.py [--doc docs/targets.md] [--arch llama --arch gemma2 ...]

CPU, float32, tiny random targets: a couple of minutes on 2 cores. A check that raises is a
failed cell, named in the output; the exit status is non-zero if any cell failed.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # arch_matrix.py and floats.py live with the tests

START, END = "<!-- matrix:start -->", "<!-- matrix:end -->"


def run(archs: list[str]) -> tuple[list, list[str]]:
    import torch
    from arch_matrix import REFUSED, Row, check_refused, check_served

    torch.set_num_threads(1)  # tiny models: thread hand-offs cost more than the work
    rows, failures = [], []
    for arch in archs:
        with tempfile.TemporaryDirectory() as work:
            try:
                row = check_refused(arch, Path(work)) if arch in REFUSED else check_served(arch, Path(work))
            except Exception as exc:  # a raised check is a failed row, not a stopped matrix
                traceback.print_exc()
                row = Row(arch, "?", "?", "?", train=False)
                failures.append(f"{arch}: {type(exc).__name__}: {exc}")
        rows.append(row)
        print(f"[matrix] {row}", flush=True)
    return rows, failures


def write_table(doc: Path, table: str) -> None:
    text = doc.read_text()
    if START not in text or END not in text:
        raise SystemExit(f"{doc}: no {START} ... {END} markers to write the table between")
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    doc.write_text(f"{head}{START}\n{table}{END}{tail}")


def main() -> None:
    from arch_matrix import ARCHS, markdown

    p = argparse.ArgumentParser(description="Write the architecture matrix into docs/targets.md.")
    p.add_argument("--doc", default=str(ROOT / "docs" / "targets.md"))
    p.add_argument("--arch", action="append", default=None, choices=ARCHS, help="repeatable; default: all")
    args = p.parse_args()
    rows, failures = run(args.arch or list(ARCHS))
    write_table(Path(args.doc), markdown(rows))
    print(f"wrote {args.doc}" + (f"; FAILED: {'; '.join(failures)}" if failures else ""))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
