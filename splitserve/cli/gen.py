"""`splitserve gen`: regenerate a prompt set's assistant turns with the target (in process or
through OpenAI-compatible endpoints)."""

from __future__ import annotations

import argparse
import os
import sys

from splitserve.cli.flags import Flags, json_object, new_parser


def gen_parser() -> tuple[argparse.ArgumentParser, Flags]:
    from splitserve.config import EndpointConfig, GenConfig, RemoteOptions

    p = new_parser(prog="splitserve gen",
        description="Regenerate every assistant turn of a chat JSONL with the target itself (resumable).",
    )
    f = Flags(p)
    f.add(GenConfig, "data", "--data",
          help="chat data: JSONL/JSON/Parquet/Arrow, a save_to_disk directory or a glob (docs/data.md)")
    f.add(GenConfig, "out", "--out", required=True, help="output JSONL; appended to, and a rerun resumes it")
    f.add(GenConfig, "target", "--target", help="target name or HF directory")
    f.add(GenConfig, "target_name", "--target-name", help="name recorded in each row (default: the directory's)")
    f.add(GenConfig, "max_new_tokens", "--max-new-tokens", type=int, help="per reply")
    f.add(GenConfig, "temperature", "--temperature", type=float, help="0: greedy")
    f.add(GenConfig, "top_p", "--top-p", type=float, help="nucleus sampling mass (1: off)")
    f.add(GenConfig, "top_k", "--top-k", type=int, help="0: off")
    f.add(GenConfig, "seed", "--seed", type=int, help="sampling seed")
    f.add(GenConfig, "batch_size", "--batch-size", type=int, help="conversations in flight (continuous) or per batch")
    f.add(GenConfig, "batching", "--batching", choices=("continuous", "static"),
          help="continuous: a finished conversation frees its slot at once; static: whole-batch turns "
               "(sampled runs reproducible row by row)")
    f.add(GenConfig, "max_rows", "--max-rows", type=int, help="read only the first N input rows")
    f.add(GenConfig, "max_turns", "--max-turns", type=int, help="replies per conversation (default: every user turn)")
    f.add(GenConfig, "max_length", "--max-length", type=int, help="no reply to a prompt this many tokens long")
    f.add(GenConfig, "device", "--device", help="auto (CUDA when available) | cpu | cuda[:N]")
    f.add(GenConfig, "dtype", "--dtype", help="auto (bfloat16 on CUDA, float32 elsewhere) | float32 | bfloat16")
    f.add(GenConfig, "chat_template", "--chat-template", metavar="FILE",
          help="Jinja file replacing the target's chat template (in-process runs)")
    f.add(GenConfig, "chat_template_kwargs", "--chat-template-kwargs", type=json_object, metavar="JSON",
          help='handed to the chat template (in-process, or sent to the servers), '
               'e.g. \'{"enable_thinking": false}\'')
    remote = p.add_argument_group("through OpenAI-compatible servers (SGLang, vLLM, splitserve serve)")
    f.add(EndpointConfig, "urls", "--endpoint", group=remote, action="append", default=[], metavar="URL",
          help="server root, e.g. http://host:30000 (repeat for several; requests go round-robin)")
    f.add(EndpointConfig, "concurrency", "--concurrency", group=remote, type=int,
          help="requests in flight per endpoint")
    f.add(EndpointConfig, "timeout_s", "--request-timeout", group=remote, type=float, metavar="REQUEST_TIMEOUT",
          help="seconds per request")
    f.add(EndpointConfig, "retries", "--retries", group=remote, type=int,
          help="per request, on timeouts, dropped connections, 5xx")
    f.add(RemoteOptions, "num_samples", "--num-samples", group=remote, type=int,
          help="sampled replies per conversation, a row each")
    f.add(RemoteOptions, "reasoning", "--reasoning", group=remote, choices=("keep", "drop"),
          help="keep the server's reasoning_content in the assistant message, or drop it")
    f.add(EndpointConfig, "api_key", "--api-key", group=remote, default=os.environ.get("OPENAI_API_KEY"),
          help="bearer token (default: $OPENAI_API_KEY)")
    return p, f


def gen_main(argv: list[str]) -> None:
    p, f = gen_parser()
    args = p.parse_args(argv)
    from splitserve.config import EndpointConfig, GenConfig, RemoteOptions
    from splitserve.data import DataError
    from splitserve.data.gen import run_gen

    cfg = f.build(GenConfig, args)
    opts = None
    if args.urls:
        opts = f.build(RemoteOptions, args, endpoint=f.build(EndpointConfig, args))
    elif args.num_samples != RemoteOptions.num_samples:
        p.error("--num-samples is for --endpoint runs")
    try:
        cfg.check()
        if opts is not None:
            opts.check(cfg)
    except ValueError as e:
        p.error(str(e))
    try:
        if opts is not None:
            from splitserve.data.endpoint import RequestFailed
            from splitserve.data.gen_remote import run_gen_remote

            try:
                summary = run_gen_remote(cfg, opts)
            except RequestFailed as e:
                sys.exit(f"splitserve gen: {e}")
        else:
            summary = run_gen(cfg)
    except DataError as e:
        sys.exit(f"splitserve gen: {e}")
    print(summary.format())
