"""Build and run the server from configs: load (compatibility checked first), engine, warm-up,
serve until interrupted, close."""

from __future__ import annotations

import logging
from pathlib import Path

from splitserve.serve.config import EngineConfig, ModelsConfig, ServerConfig
from splitserve.serve.engine import Engine
from splitserve.serve.loading import load_models
from splitserve.serve.server import SplitServer, build_server
from splitserve.target.eos import eos_ids


def make_server(models: ModelsConfig, engine_cfg: EngineConfig, server_cfg: ServerConfig) -> SplitServer:
    target, draft = load_models(models)
    engine = Engine(target, draft, engine_cfg)
    engine.warmup("spec", 0.0)  # capture the greedy round's CUDA graph before the first client
    name = server_cfg.model_name or Path(models.draft).resolve().name
    return build_server(engine, target.tokenizer, eos_ids(target), server_cfg, name)


def run_server(models: ModelsConfig, engine_cfg: EngineConfig, server_cfg: ServerConfig) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    server = make_server(models, engine_cfg, server_cfg)
    e = server.engine
    print(f"splitserve: serving '{server.model_name}' on {server.url}/v1 (target {e.target.info.name}, "
          f"γ={e.gamma}, context {e.max_context}, device {e.device}, "
          f"CUDA graphs {'on' if e.graphs.enabled else 'off'})", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        server.worker.stop()
