"""The pinned vLLM release's own Python source, run on a CPU without importing vllm.

vllm 0.33.0 needs CUDA and its compiled extensions at import, so the tests never import it. As
tests/sglang_release.py does for SGLang, they read the wheel (SPLITSERVE_VLLM_WHEEL, else the
user cache, else `pip download --no-deps` into it), parse the files they need and compile chosen
definitions (top-level functions and classes by name, or single methods of a class) into a
namespace the test fills with stand-ins for what those definitions reach outside themselves
(tests/release_code.py). A name the compiled code reaches that is neither compiled nor given
raises NameError: a changed code path fails the test, loudly. Triton kernels compile with
`interpret=True` and run under Triton's interpreter on CPU tensors, on any machine.
"""

from __future__ import annotations

import ast
import functools
import zipfile

from release_code import compile_into, pick, pick_methods, release_wheel

VERSION = "0.33.0"
ENV = "SPLITSERVE_VLLM_WHEEL"


@functools.lru_cache(maxsize=1)
def wheel() -> zipfile.ZipFile:
    """The vllm wheel (SPLITSERVE_VLLM_WHEEL, else downloaded once into the user cache, 336 MB).
    Skips, naming pip's error, only when it cannot be had from the package index."""
    return release_wheel("vllm", VERSION, "manylinux_2_28_x86_64", ENV, timeout_s=1800)


def source(path: str) -> str:
    """A file of the release by its path in the wheel, e.g. "vllm/v1/worker/gpu/cp_utils.py"."""
    return wheel().read(path).decode()


@functools.lru_cache(maxsize=None)
def tree(path: str) -> ast.Module:
    return ast.parse(source(path), filename=path)


def _module(path: str) -> str:
    return f"vllm_release.{path.removesuffix('.py').replace('/', '.')}"


def compile_defs(path: str, names: list[str], namespace: dict, interpret: bool = False) -> dict:
    """The named top-level definitions of a release file, compiled in file order into namespace
    (release_code.compile_into; `interpret` for Triton kernels)."""
    nodes = pick(tree(path), names, f"vllm {VERSION} {path}")
    return compile_into(nodes, path, _module(path), namespace, interpret)


def compile_methods(path: str, cls: str, names: list[str], namespace: dict) -> dict:
    """Methods of a release class, compiled as plain functions: -> {name: function}, to call with
    a stand-in `self` or to set on a stand-in class."""
    nodes = pick_methods(tree(path), cls, names, f"vllm {VERSION} {path}")
    ns = compile_into(nodes, path, _module(path) + f".{cls}", dict(namespace))
    return {n: ns[n] for n in names}
