"""Build and run the server from configs: every cheap check first (the port, the chat template
file, the draft's compatibility), then load, engine, warm-up, serve until interrupted, close."""

from __future__ import annotations

import logging
from pathlib import Path

from splitserve.config import EngineConfig, ModelsConfig, ServerConfig
from splitserve.errors import UserError
from splitserve.loading import DraftMeta, load_models
from splitserve.serve.server import SplitServer, bind_socket, build_server
from splitserve.speculative.engine import Engine


def read_chat_template(path: str | None) -> str | None:
    """The --chat-template file's text (a Jinja template), or None for the tokenizer's own."""
    if path is None:
        return None
    p = Path(path)
    if not p.is_file():
        raise UserError(f"--chat-template {path}: no such file")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"--chat-template {path}: not UTF-8 text (byte {exc.start})") from None
    if not text.strip():
        raise UserError(f"--chat-template {path}: the file is empty")
    try:
        import jinja2

        jinja2.Environment().parse(text)
    except jinja2.TemplateSyntaxError as exc:
        raise UserError(f"--chat-template {path}: line {exc.lineno}: {exc.message}") from None
    return text


def make_server(models: ModelsConfig, engine_cfg: EngineConfig, server_cfg: ServerConfig,
                meta: DraftMeta | None = None) -> SplitServer:
    """`meta`: the draft's metadata when the caller has read it already."""
    template = read_chat_template(server_cfg.chat_template)
    sock = bind_socket(server_cfg.host, server_cfg.port)  # a port in use fails here, before any weights
    try:
        target, draft = load_models(models, meta)
        engine = Engine(target, draft, engine_cfg)
        engine.warmup("spec", 0.0)  # capture the greedy round's CUDA graph before the first client
    except BaseException:
        sock.close()
        raise
    name = server_cfg.served_model_name or target.info.name
    return build_server(engine, target.tokenizer, target.eos_ids(), server_cfg, name, sock, template)


def run_server(models: ModelsConfig, engine_cfg: EngineConfig, server_cfg: ServerConfig,
               meta: DraftMeta | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    server = make_server(models, engine_cfg, server_cfg, meta)
    e = server.engine
    print(f"splitserve: serving '{server.model_name}' on {server.url}/v1 (target {e.target.info.name}, "
          f"γ={e.gamma}, context {e.max_context}, device {e.device}, "
          f"decoder {getattr(e.target, 'decoder_label', 'transformers')}, "
          f"CUDA graphs {'on' if e.graphs.enabled else 'off'}"
          f"{', API key required' if server_cfg.api_key else ''})", flush=True)
    try:
        server.serve_forever()  # uvicorn handles SIGINT / SIGTERM: a graceful stop, then re-raises them
    except KeyboardInterrupt:
        pass
    finally:
        server.sock.close()
        server.worker.stop()
