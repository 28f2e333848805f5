#!/usr/bin/env bash
# Rewrite constraints.txt: resolve pyproject's ranges to their newest releases in a fresh venv
# (torch pinned to $TORCH), then freeze. Run it when a dependency range moves, then run the
# suite through launch/setup.sh before committing the new file.
#   TORCH=2.13.0 bash launch/lock.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TORCH=${TORCH:-2.13.0}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$PY" -m venv "$tmp/venv"
pip=("$tmp/venv/bin/python" -m pip --disable-pip-version-check -q)
"${pip[@]}" install --upgrade pip >/dev/null 2>&1
"${pip[@]}" install "torch==$TORCH" 2>&1 | grep -v "^WARNING: Location" || true
"${pip[@]}" install -e ".[dev]" 2>&1 | grep -v "^WARNING: Location" || true
{
    echo "# The tested set: launch/setup.sh and CI install exactly these (pip -c). Written by"
    echo "# launch/lock.sh on $("$PY" -c 'import platform; print(platform.python_version(), platform.machine())'); edit pyproject.toml's ranges, not this file."
    # splitserve itself is not pinned; a torch build's local label (+cpu, +cu130) is dropped so that
    # the pin holds for whichever build an index offers.
    "${pip[@]}" freeze --all --exclude pip --exclude splitserve | sed -E 's/^(torch==[^+]+)\+.*/\1/' | LC_ALL=C sort -f
} > constraints.txt
echo "[lock] constraints.txt: $(grep -vc '^#' constraints.txt) packages"
