"""The layer table of docs/architecture.md, enforced over every import in the package."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PKG = REPO / "splitserve"


def layer_table(markdown: str) -> dict[str, int]:
    """The `| layer | packages | job |` table -> {package or root module: layer}."""
    layers = {}
    for line in markdown.splitlines():
        m = re.match(r"\|\s*(\d+)\s*\|([^|]+)\|", line)
        if m:
            for name in m.group(2).split(","):
                layers[name.strip()] = int(m.group(1))
    return layers


def unit_of(module: str) -> str:
    """splitserve.speculative.engine -> speculative; splitserve.config -> config."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "<package>"


def imports_of(path: Path, module: str) -> list[tuple[str, int]]:
    """Every splitserve module `path` imports, at module level or inside functions: (module, line)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                base = module.split(".")[: -node.level] if path.name != "__init__.py" else \
                    module.split(".")[: len(module.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target == "splitserve":  # from splitserve import config
                out += [(f"splitserve.{a.name}", node.lineno) for a in node.names]
            else:
                out.append((target, node.lineno))
    return [(m, line) for m, line in out if m == "splitserve" or m.startswith("splitserve.")]


def violations(pkg: Path, layers: dict[str, int]) -> list[str]:
    found = []
    for path in sorted(pkg.rglob("*.py")):
        rel = path.relative_to(pkg.parent).with_suffix("")
        module = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        src = unit_of(module)
        if src == "<package>":
            continue
        if src not in layers:
            found.append(f"{path.relative_to(pkg.parent)}: {src} is in no layer of the table")
            continue
        for imported, line in imports_of(path, module):
            dst = unit_of(imported)
            if dst == src:
                continue
            if dst not in layers:
                found.append(f"{path.relative_to(pkg.parent)}:{line}: imports {imported}, which is in no layer")
            elif layers[dst] >= layers[src]:
                found.append(f"{path.relative_to(pkg.parent)}:{line}: {src} (layer {layers[src]}) imports "
                             f"{imported} (layer {layers[dst]})")
    return found


@pytest.fixture(scope="module")
def table() -> dict[str, int]:
    layers = layer_table((REPO / "docs" / "architecture.md").read_text())
    assert len(layers) >= 15, "docs/architecture.md lost its layer table"
    return layers


def test_every_import_points_down_the_layer_table(table):
    assert violations(PKG, table) == []


def test_every_package_and_root_module_has_a_layer(table):
    units = {p.name for p in PKG.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    units |= {p.stem for p in PKG.glob("*.py") if p.name != "__init__.py"}
    assert units - set(table) == set()
    assert set(table) - units == set(), "the table names a package that does not exist"


def test_the_check_catches_an_upward_import_inside_a_function(tmp_path, table):
    """A copy of two packages where the model imports the engine lazily: the check must name it."""
    pkg = tmp_path / "splitserve"
    (pkg / "models").mkdir(parents=True)
    (pkg / "speculative").mkdir()
    for d in (pkg, pkg / "models", pkg / "speculative"):
        (d / "__init__.py").write_text("")
    (pkg / "speculative" / "engine.py").write_text("from splitserve.models import dspark\n")
    (pkg / "models" / "dspark.py").write_text("def f():\n    from splitserve.speculative.engine import Engine\n")
    (pkg / "models" / "heads.py").write_text("from .. import loading\n")
    found = violations(pkg, table)
    assert found == [
        "splitserve/models/dspark.py:2: models (layer 1) imports splitserve.speculative.engine (layer 4)",
        "splitserve/models/heads.py:1: models (layer 1) imports splitserve.loading (layer 6)",
    ]


@pytest.mark.parametrize("module", ["splitserve", "splitserve.config", "splitserve.errors"])
def test_importing_the_package_or_its_config_loads_nothing_heavy(module):
    heavy = ("torch", "transformers", "numpy", "hydra")
    code = f"import sys, {module}; print(sorted(m for m in {heavy!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "[]"


def test_tests_never_import_bench():
    """bench/ scripts may use the tests' support modules (tiny models, the architecture matrix);
    tests never depend on a bench script: what a test needs from one belongs in the package."""
    found = []
    for path in sorted((REPO / "tests").glob("*.py")):
        text = path.read_text()
        for node in ast.walk(ast.parse(text)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            found += [f"{path.name}:{node.lineno}: imports {n}" for n in names if n.split(".")[0] == "bench"]
        if re.search(r"""["']bench["']\s*/|["']bench/[\w./]+\.py["']""", text):
            found.append(f"{path.name}: loads a file under bench/")
    assert found == []
