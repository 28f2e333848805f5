"""The live server's streamed greedy replies against the target's own greedy decoding, on real
held-out prompts.

    python bench/server_exactness.py --draft runs/quickstart --num-prompts 50 --max-tokens 48 \
        --out docs/results/exactness/server_exactness_smollm2.json

Starts `splitserve serve`'s server in this process (real SmolLM2 target, a trained draft),
sends each held-out chitchat prompt through the official `openai` client with stream=True and
temperature 0, and compares the streamed text and token count with a second copy of the target
decoding greedily on its own (no draft). Prints a summary and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import time

import openai

from splitserve.config import EngineConfig, ModelsConfig, ServerConfig, TargetConfig
from splitserve.data import encode_prompt, read_prompts, resolve_prompts_path
from splitserve.serve.app import make_server
from splitserve.speculative.decode import target_decode
from splitserve.target.eos import eos_ids
from splitserve.target.hf import load_hf_target


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--draft", required=True, help="exported draft or training run directory")
    ap.add_argument("--prompts", default="chitchat")
    ap.add_argument("--num-prompts", type=int, default=50)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    server = make_server(ModelsConfig(draft=args.draft, device=args.device),
                         EngineConfig(max_context=2048), ServerConfig(port=0, served_model_name="draft"))
    server.start_background()
    reference = load_hf_target(TargetConfig(device=args.device))  # a second copy, never shared
    eos = set(eos_ids(reference))
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=600)
    prompts = read_prompts(resolve_prompts_path(args.prompts))[: args.num_prompts]
    rows, t0 = [], time.time()
    try:
        for i, prompt in enumerate(prompts):
            messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
            stream = client.chat.completions.create(model="draft", messages=messages, max_tokens=args.max_tokens,
                                                    temperature=0, stream=True,
                                                    stream_options={"include_usage": True})
            chunks = list(stream)
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            n_out = chunks[-1].usage.completion_tokens
            ids = target_decode(reference, encode_prompt(reference.tokenizer, messages), args.max_tokens, eos_ids=eos)
            want = reference.tokenizer.decode(ids, skip_special_tokens=True)
            rows.append({"prompt": i, "exact": text == want and n_out == len(ids), "tokens": len(ids)})
            print(f"prompt {i + 1}/{len(prompts)}: {'exact' if rows[-1]['exact'] else 'DIFFERENT'} "
                  f"({len(ids)} tokens)", flush=True)
        metrics = server.metrics.render()
    finally:
        server.close()
    exact = sum(r["exact"] for r in rows)
    accept = [line for line in metrics.splitlines() if line.startswith("splitserve_mean_accept_length")]
    summary = {"prompts": len(rows), "exact": exact, "tokens": sum(r["tokens"] for r in rows),
               "max_tokens": args.max_tokens, "draft": args.draft, "wall_s": time.time() - t0,
               "server_mean_accept_length": accept[0].split()[-1] if accept else None, "rows": rows}
    with open(args.out, "w") as f:
        json.dump(summary, f, indent=1)
    print(f"{exact}/{len(rows)} streamed greedy replies equal the target's own greedy output "
          f"({summary['tokens']} tokens; mean accept length {summary['server_mean_accept_length']})")


if __name__ == "__main__":
    main()
