"""Throughput of `splitserve gen` three ways on the same prompts: in-process with static batches,
in-process with continuous batching, and `--endpoint` against a live `splitserve serve`.

    python bench/gen_gpu.py --data chitchat --num-prompts 2000 --out-dir gen_bench \
        [--batch-size 256] [--max-new-tokens 256] [--concurrency 8] [--modes static continuous endpoint]

Each mode regenerates the first reply (max_turns=1) of the same prompts, greedy, with the
embedded SmolLM2 in bf16 on CUDA (float32 on a CPU smoke run), into its own file. The server
of the endpoint mode is the bundled batch-1 speculative engine with an untrained γ=16 draft
(τ about 1), so that mode measures the client over a real server rather than a fast one.
Rows/s and tokens/s per mode, and how many rows each mode wrote equal to the static one's
(bf16 batches of other shapes can flip near-ties), go to OUT_DIR/gen_bench.json.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from splitserve.data.endpoint import EndpointConfig
from splitserve.data.gen import GenConfig, run_gen
from splitserve.data.gen_remote import RemoteOptions, run_gen_remote


def _rows(path: Path) -> dict[str, list]:
    return {r["gen"]["source_row"]: r["messages"] for r in map(json.loads, path.read_text().splitlines())}


def _serve_untrained(out_dir: Path, device: str, dtype: str):
    from splitserve.config import DraftConfig, EngineConfig, ModelsConfig, ServerConfig, TargetConfig
    from splitserve.export import export_draft
    from splitserve.models.build import build_draft, resolve_arch
    from splitserve.serve.app import make_server
    from splitserve.target.hf import load_hf_target

    target = load_hf_target(TargetConfig(device=device, dtype="float32"))
    torch.manual_seed(0)
    arch = resolve_arch(DraftConfig(block_size=16, num_layers=4), target.info, target.config, target.tokenizer)
    draft_dir = export_draft(build_draft(arch, target).eval(), out_dir / "untrained_draft", target.info)
    del target
    srv = make_server(ModelsConfig(draft=str(draft_dir), target="smollm2-135m", device=device, dtype=dtype),
                      EngineConfig(max_context=2048), ServerConfig(port=0, served_model_name="smollm2-135m-spec"))
    srv.start_background()
    return srv


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="chitchat")
    ap.add_argument("--num-prompts", type=int, default=2000)
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--modes", nargs="+", default=["static", "continuous", "endpoint"])
    ap.add_argument("--resume", action="store_true", help="keep the rows already in OUT_DIR (a run cut short)")
    args = ap.parse_args()
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    dtype = "bfloat16" if args.device.startswith("cuda") else "float32"
    common = dict(data=args.data, max_rows=args.num_prompts, max_turns=1, max_new_tokens=args.max_new_tokens,
                  max_length=2048 - args.max_new_tokens)
    results: dict[str, dict] = {}
    for mode in args.modes:
        out = out_dir / f"gen_{mode}.jsonl"
        if not args.resume:
            out.unlink(missing_ok=True)
        t0 = time.time()
        if mode == "endpoint":
            srv = _serve_untrained(out_dir, args.device, dtype)
            t0 = time.time()  # the server's start (weights, graph capture) is not the client's time
            s = run_gen_remote(GenConfig(out=str(out), **common),
                               RemoteOptions(EndpointConfig([srv.url], concurrency=args.concurrency)))
            srv.close()
        else:
            s = run_gen(GenConfig(out=str(out), device=args.device, dtype=dtype, batch_size=args.batch_size,
                                  batching=mode, **common))
        secs = time.time() - t0
        results[mode] = {"rows": s.written, "already_there": s.already_done, "seconds": round(secs, 2),
                         "rows_per_s": round(s.written / secs, 2),
                         "new_tokens": s.new_tokens, "tokens_per_s": round(s.new_tokens / secs, 1),
                         "replies_cut": s.unfinished}
        print(f"[bench] {mode}: {results[mode]}", flush=True)
    if (out_dir / "gen_static.jsonl").exists():
        ref = _rows(out_dir / "gen_static.jsonl")
        for mode in results:
            got = _rows(out_dir / f"gen_{mode}.jsonl")
            results[mode]["rows_equal_to_static"] = sum(got.get(k) == v for k, v in ref.items())
    meta = {"device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu", "dtype": dtype,
            "torch": torch.__version__, "args": vars(args)}
    (out_dir / "gen_bench.json").write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
