"""target.backend=sglang: clear refusal where it cannot run (CPU tests), a static contract that
everything it uses exists in the pinned sglang release (its wheel's source, parsed, never imported),
and parity with the transformers backend where it can run (skipped unless sglang and a CUDA GPU are
present; bench/sglang_target_gpu.sh runs it)."""

import ast
import importlib.util
from pathlib import Path

import pytest
import sglang_release as sr
import torch

import splitserve.target.sglang_backend as sb
from splitserve.config import RunConfig, TargetConfig
from splitserve.target import load_target

HAVE_SGLANG_GPU = importlib.util.find_spec("sglang") is not None and torch.cuda.is_available()


def _no_heavy_work(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("the target was loaded before the requirement check")

    monkeypatch.setattr(sb, "start_runner", refuse)
    monkeypatch.setattr("transformers.AutoConfig.from_pretrained", refuse)


def test_missing_sglang_fails_at_start(monkeypatch):
    _no_heavy_work(monkeypatch)
    monkeypatch.setattr(sb, "_sglang_installed", lambda: False)
    with pytest.raises(sb.SGLangUnavailable, match=r"sglang package is not installed \(pip install -e '\.\[sglang\]'"):
        load_target(TargetConfig(backend="sglang"))


def test_no_cuda_fails_at_start(monkeypatch):
    _no_heavy_work(monkeypatch)
    monkeypatch.setattr(sb, "_sglang_installed", lambda: True)
    monkeypatch.setattr(sb, "_sglang_version", lambda: sb.SGLANG_VERSION)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(sb.SGLangUnavailable, match="no CUDA GPU is visible") as err:
        load_target(TargetConfig(backend="sglang"))
    assert "not installed" not in str(err.value)


def test_cpu_device_is_refused(monkeypatch):
    monkeypatch.setattr(sb, "_sglang_installed", lambda: True)
    monkeypatch.setattr(sb, "_sglang_version", lambda: sb.SGLANG_VERSION)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert sb.missing_requirements("cpu") == ["target.device=cpu is not a CUDA device"]
    assert sb.missing_requirements("cuda:1") == [] and sb.missing_requirements("auto") == []


def test_unknown_backend_is_refused():
    with pytest.raises(ValueError, match=r"transformers.*sglang.*'vllm'"):
        load_target(TargetConfig(backend="vllm"))


@pytest.mark.parametrize("command", ["train", "dump"])
def test_train_and_dump_go_through_the_backend_choice(monkeypatch, tmp_path, command):
    """Both entry points load their target through load_target, so the refusal comes first."""
    _no_heavy_work(monkeypatch)
    monkeypatch.setattr(sb, "_sglang_installed", lambda: False)
    cfg = RunConfig()
    cfg.target.backend = "sglang"
    cfg.run_dir = str(tmp_path / "run")
    cfg.dump.out_dir = str(tmp_path / "dump")
    if command == "train":
        from splitserve.train.loop import train as run
    else:
        from splitserve.stream.dump_capture import run_dump as run
    with pytest.raises(sb.SGLangUnavailable, match="target.backend=sglang cannot start"):
        run(cfg)


def test_decoding_is_refused_with_a_pointer():
    from splitserve.errors import UserError
    from splitserve.speculative.engine import Engine

    t = sb.SGLangTarget.__new__(sb.SGLangTarget)  # a capture-only target: no decoding methods at all
    assert not hasattr(t, "new_cache")
    with pytest.raises(UserError, match="target.backend=transformers"):
        Engine(t, None)


# ---- parity on a GPU with sglang installed -------------------------------------------------


@pytest.mark.skipif(not HAVE_SGLANG_GPU, reason="needs sglang and a CUDA GPU")
def test_sglang_captures_match_transformers_within_bf16():
    from splitserve.target.hf import load_hf_target

    cfg = TargetConfig(dtype="bfloat16", device="cuda", sglang_mem_fraction=0.3)  # embedded SmolLM2-135M
    hf = load_hf_target(cfg)
    sg = load_target(TargetConfig(**{**cfg.__dict__, "backend": "sglang"}))
    assert sg.info == hf.info
    v = hf.info.vocab_size
    # bit-equal: both loaders copy the same checkpoint tensors (no arithmetic)
    torch.testing.assert_close(sg.embed_weight().float(), hf.embed_weight()[:v].float(), rtol=0, atol=0)
    torch.testing.assert_close(sg.lm_head_weight().float(), hf.lm_head_weight()[:v].float(), rtol=0, atol=0)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, v, (2, 96), generator=gen).cuda()
    mask = torch.ones_like(ids)
    mask[1, 70:] = 0  # a right-padded row
    got, want = sg.capture(ids, mask), hf.capture(ids, mask)
    d = hf.info.hidden_size
    for name, a, b in (("aux", got.aux, want.aux), ("final", got.final, want.final)):
        for row, n in ((0, 96), (1, 70)):
            for j in range(a.shape[-1] // d):  # per captured layer: relative error of the whole (T, D) slab
                x, y = a[row, :n, j * d : (j + 1) * d].float(), b[row, :n, j * d : (j + 1) * d].float()
                rel = ((x - y).norm() / y.norm()).item()
                assert rel < 2e-2, f"{name} row {row} layer slot {j}: relative error {rel:.4f}"
        assert not a[1, 70:].any()  # padding stays zero


def test_another_sglang_version_is_refused_with_the_reason(monkeypatch):
    monkeypatch.setattr(sb, "_sglang_installed", lambda: True)
    monkeypatch.setattr(sb, "_sglang_version", lambda: "0.5.22")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    (problem,) = sb.missing_requirements("cuda")
    assert "sglang 0.5.22 is installed" in problem and "pip install 'sglang==0.5.23'" in problem


# ---- static contract: everything the backend uses exists in sglang 0.5.23 -----------------
# The wheel's source is parsed (tests/sglang_release.py); sglang is never imported.

BACKEND = ast.parse(Path(sb.__file__).read_text())
# instance expressions in the backend -> (release file, class) they hold
INSTANCES = {
    "runner": ("model_executor/model_runner.py", "ModelRunner"),
    "self.runner": ("model_executor/model_runner.py", "ModelRunner"),
    "batch": ("managers/schedule_batch.py", "ScheduleBatch"),
    "req": ("managers/schedule_batch.py", "Req"),
    "self.model": ("models/llama.py", "LlamaForCausalLM"),  # the embedded SmolLM2 target's class
    "runner.req_to_token_pool": ("mem_cache/memory_pool.py", "ReqToTokenPool"),
    "self.runner.req_to_token_pool": ("mem_cache/memory_pool.py", "ReqToTokenPool"),
    "runner.token_to_kv_pool_allocator": ("mem_cache/allocator/base.py", "BaseTokenToKVPoolAllocator"),
    "self.runner.token_to_kv_pool_allocator": ("mem_cache/allocator/base.py", "BaseTokenToKVPoolAllocator"),
}
# config bags (runtime_context.get_<bag>() and resolving_view) -> the field files they expose
BAGS = {"get_schedule": ["schedule.py"], "get_model": ["model.py"], "get_device": ["device.py"],
        "resolving_view": None}  # None: any field file


def _module_file(module: str) -> str:
    rel = module.removeprefix("sglang.srt.").replace(".", "/")
    names = set(sr.wheel().namelist())
    for cand in (f"{rel}.py", f"{rel}/__init__.py"):
        if sr.SRT + cand in names:
            return cand
    raise AssertionError(f"sglang {sr.VERSION} has no module {module}")


def _sglang_imports() -> dict[str, tuple[str, str]]:
    """local name -> (module, name) for every `from sglang... import` in the backend."""
    out = {}
    for node in ast.walk(BACKEND):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sglang"):
            for a in node.names:
                out[a.asname or a.name] = (node.module, a.name)
    return out


def _class(file: str, name: str) -> ast.ClassDef:
    node = sr.top_level(file).get(name)
    assert isinstance(node, ast.ClassDef), f"sglang {sr.VERSION} {file} has no class {name}"
    return node


def _class_attrs(file: str, name: str, depth: int = 0) -> set[str]:
    """Methods, class-level fields and `self.x = ...` attributes of a class and its bases."""
    cls, attrs = _class(file, name), set()
    for node in ast.walk(cls):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            attrs.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            attrs.add(node.target.id)
        elif isinstance(node, ast.Assign):
            attrs |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        for t in (node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]):
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                attrs.add(t.attr)
    imports = {a.asname or a.name: n.module for n in sr.tree(file).body if isinstance(n, ast.ImportFrom)
               for a in n.names}
    for base in cls.bases:
        if _dotted(base) in ("nn.Module", "torch.nn.Module"):
            attrs |= set(dir(torch.nn.Module))
        if isinstance(base, ast.Name) and depth < 4:
            if base.id in sr.top_level(file):
                attrs |= _class_attrs(file, base.id, depth + 1)
            elif (imports.get(base.id) or "").startswith("sglang"):
                attrs |= _class_attrs(_module_file(imports[base.id]), base.id, depth + 1)
    return attrs


def _params(fn: ast.FunctionDef) -> tuple[set[str], bool, int]:
    """(keyword names, takes **kwargs, max positional count or -1 for *args), `self`/`cls` dropped."""
    a = fn.args
    pos = [p.arg for p in a.posonlyargs + a.args]
    if pos and pos[0] in ("self", "cls"):
        pos = pos[1:]
    return set(pos) | {p.arg for p in a.kwonlyargs}, a.kwarg is not None, -1 if a.vararg else len(pos)


def _resolve(module: str, name: str, depth: int = 0) -> tuple[str, ast.AST | None]:
    """Where `from module import name` lands in the release: (file, its def or class), following
    package re-exports; (submodule file, None) for a submodule."""
    file = _module_file(module)
    defs = sr.top_level(file)
    if name in defs:
        return file, defs[name]
    for n in sr.tree(file).body:
        if isinstance(n, ast.ImportFrom) and depth < 4 and any((a.asname or a.name) == name for a in n.names):
            src = n.module or ""
            if n.level:  # relative: from .x import name
                pkg = module if file.endswith("__init__.py") else module.rsplit(".", 1)[0]
                pkg = pkg.rsplit(".", n.level - 1)[0] if n.level > 1 else pkg
                src = f"{pkg}.{src}" if src else pkg
            orig = next(a.name for a in n.names if (a.asname or a.name) == name)
            return _resolve(src, orig, depth + 1)
    return _module_file(f"{module}.{name}"), None


def _callee(local: str, attr: str | None, imports) -> tuple[ast.AST | None, str]:
    """What a call on an imported name resolves to in the release: (def or class, label)."""
    module, name = imports[local]
    file, node = _resolve(module, name)
    if node is None:  # a submodule (`from sglang.srt.distributed import bootstrap`)
        assert attr is not None
        return sr.top_level(file).get(attr), f"{module}.{name}.{attr}"
    if attr is not None:
        assert isinstance(node, ast.ClassDef), f"{name}.{attr}"
        meth = next((n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == attr), None)
        return meth, f"{name}.{attr}"
    return node, name


def test_every_sglang_import_exists_in_the_release():
    for module, name in _sglang_imports().values():
        _resolve(module, name)  # raises, naming the module, when neither a definition nor a submodule


def test_every_sglang_call_passes_arguments_the_release_takes():
    imports, checked = _sglang_imports(), []
    fields = {n.target.id for f in sr.wheel().namelist() if f.startswith(sr.SRT + "arg_groups/fields/")
              for n in ast.walk(sr.tree(f.removeprefix(sr.SRT))) if isinstance(n, ast.AnnAssign)
              and isinstance(n.target, ast.Name)}
    for call in (n for n in ast.walk(BACKEND) if isinstance(n, ast.Call)):
        f = call.func
        if isinstance(f, ast.Name) and f.id in imports:
            local, attr = f.id, None
        elif isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id in imports:
            local, attr = f.value.id, f.attr
        else:
            continue
        node, label = _callee(local, attr, imports)
        assert node is not None, f"sglang {sr.VERSION} has no {label}"
        kws = {k.arg for k in call.keywords if k.arg}
        if label == "ServerArgs":  # assembled from the arg_groups/fields namespaces
            assert kws <= fields, f"ServerArgs has no fields {kws - fields}"
        elif isinstance(node, ast.ClassDef):
            init = next((n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
            names = _params(init)[0] if init else {n.target.id for n in node.body if isinstance(n, ast.AnnAssign)}
            assert kws <= names, f"{label}(...) takes no {kws - names}"
        elif isinstance(node, ast.FunctionDef):
            names, any_kw, n_pos = _params(node)
            assert any_kw or kws <= names, f"{label}(...) takes no {kws - names}"
            assert n_pos < 0 or len(call.args) <= n_pos, f"{label}(...) takes {n_pos} positional arguments"
        checked.append(label)
    for must in ("ModelRunner", "ScheduleBatch.init_new", "ForwardBatch.init_new", "Req", "ServerArgs",
                 "publish", "sglang.srt.distributed.bootstrap.init_parallel_runtime"):
        assert must in checked, f"the backend no longer calls {must}: update this test's expectations"


def _dotted(node) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return None if inner is None else f"{inner}.{node.attr}"
    return None


def test_every_attribute_the_backend_reads_exists_in_the_release():
    seen = set()
    for node in ast.walk(BACKEND):
        if not isinstance(node, ast.Attribute):
            continue
        owner = _dotted(node.value)
        if owner in INSTANCES:
            file, cls = INSTANCES[owner]
            assert node.attr in _class_attrs(file, cls), f"sglang {sr.VERSION} {cls} has no attribute {node.attr}"
            seen.add(owner)
        elif isinstance(node.value, ast.Call) and _dotted(node.value.func) in BAGS:
            files = BAGS[_dotted(node.value.func)]
            paths = [f"arg_groups/fields/{f}" for f in files] if files else [
                f.removeprefix(sr.SRT) for f in sr.wheel().namelist() if f.startswith(sr.SRT + "arg_groups/fields/")]
            declared = {t for p in paths for n in ast.walk(sr.tree(p))
                        for t in ([n.target.id] if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
                                  else [x.id for x in n.targets if isinstance(x, ast.Name)]
                                  if isinstance(n, ast.Assign) else [])}
            assert node.attr in declared, f"{_dotted(node.value.func)}() has no {node.attr}"
            seen.add(_dotted(node.value.func))
    assert {"runner", "batch", "req", "self.model", "get_schedule", "get_model"} <= seen


def test_the_logits_hook_reads_the_arguments_llama_passes():
    """_on_logits takes args[1] (final-norm hidden) and args[4] (aux): the release's call order."""
    fwd = next(n for n in ast.walk(_class("models/llama.py", "LlamaForCausalLM"))
               if isinstance(n, ast.FunctionDef) and n.name == "forward")
    calls = [c for c in ast.walk(fwd) if isinstance(c, ast.Call) and _dotted(c.func) == "self.logits_processor"]
    assert [[_dotted(a) for a in c.args] for c in calls] == [
        ["input_ids", "hidden_states", "self.lm_head", "forward_batch", "aux_hidden_states"]]
    setter = next(n for n in ast.walk(_class("models/llama.py", "LlamaForCausalLM"))
                  if isinstance(n, ast.FunctionDef) and n.name == "set_dflash_layers_to_capture")
    assert "val + 1" in ast.unparse(setter)  # capture point l+1 = the output of layer l (HF hidden_states[l+1])
