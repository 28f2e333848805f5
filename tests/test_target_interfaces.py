"""Every target backend implements all of each interface it claims (target/backend.py), with the
interface's signatures, and a caller that decodes refuses a capture-only backend with one line.

Checked on the classes (their methods, properties and `self.x = ...` assignments), so the SGLang
backend is checked without sglang: its module imports sglang only inside functions."""

import ast
import inspect
import textwrap

import pytest
import torch
from tiny import tiny_draft, tiny_target

from splitserve.errors import UserError
from splitserve.target.backend import (
    DECODING_MEMBERS,
    CaptureTarget,
    DecodingTarget,
    TargetWeights,
    decodes,
    members,
    require_decoding,
)
from splitserve.target.hf import HFTarget
from splitserve.target.sglang_backend import SGLangTarget
from splitserve.target.shared_weights import SharedWeightsTarget

CLAIMS = {
    HFTarget: (CaptureTarget, DecodingTarget),
    SGLangTarget: (CaptureTarget,),
    SharedWeightsTarget: (TargetWeights,),
}


def defined(cls: type) -> set[str]:
    """Names a class defines: class attributes, methods, properties, and the attributes its
    methods assign on self."""
    names = {n for base in cls.__mro__[:-1] for n in vars(base)}
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        for t in targets:
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                names.add(t.attr)
    return names


def params(fn) -> list[str]:
    return [p for p in inspect.signature(fn).parameters if p != "self"]


@pytest.mark.parametrize("cls", list(CLAIMS), ids=lambda c: c.__name__)
def test_each_backend_implements_all_of_what_it_claims(cls):
    have = defined(cls)
    for protocol in CLAIMS[cls]:
        missing = members(protocol) - have
        assert not missing, f"{cls.__name__} claims {protocol.__name__} but lacks {sorted(missing)}"
        for name in members(protocol):
            want = getattr(protocol, name, None)
            if inspect.isfunction(want):
                assert params(getattr(cls, name)) == params(want), f"{cls.__name__}.{name}: other parameters"
            elif isinstance(want, property):
                assert isinstance(getattr(cls, name), property), f"{cls.__name__}.{name} is not a property"


def test_no_backend_stubs_an_interface_it_does_not_implement():
    """A capture-only backend has no decoding methods at all (none raising NotImplementedError)."""
    for cls, claims in CLAIMS.items():
        if DecodingTarget not in claims:
            assert not DECODING_MEMBERS & defined(cls), cls.__name__
            assert not decodes(cls.__new__(cls))
        if CaptureTarget not in claims:
            assert "capture" not in defined(cls), cls.__name__
    assert decodes(tiny_target())


def test_the_interfaces_are_small_and_share_only_the_draft_weights():
    weights = members(TargetWeights)
    assert members(CaptureTarget) - weights == {"capture"}
    assert members(DecodingTarget) - weights == DECODING_MEMBERS
    assert DECODING_MEMBERS == {"new_cache", "forward_cached", "crop_cache", "new_static_cache", "forward_static",
                                "recurrent", "commit_static", "max_positions", "eos_ids", "generate"}


def _capture_only():
    return SGLangTarget.__new__(SGLangTarget)  # no runner needed: refused before any attribute is read


def test_decoding_callers_refuse_a_capture_only_backend_in_one_line():
    from splitserve.config import BenchConfig, EngineConfig, ModelsConfig
    from splitserve.evaluation.bench import run_bench
    from splitserve.evaluation.evaluate import evaluate
    from splitserve.speculative.decode import SpecDecoder, target_decode
    from splitserve.speculative.engine import Engine

    draft = tiny_draft(tiny_target())
    calls = {
        "the serving engine": lambda t: Engine(t, draft),
        "speculative decoding": lambda t: SpecDecoder(t, draft),
        "decoding with the target alone": lambda t: target_decode(t, [1, 2], 4),
        "evaluation": lambda t: evaluate(t, draft, [[1, 2]]),
        "splitserve bench": lambda t: run_bench(ModelsConfig(draft="unused"), EngineConfig(), BenchConfig(),
                                                target=t, draft=draft),
    }
    for what, call in calls.items():
        with pytest.raises(UserError) as err:
            call(_capture_only())
        msg = str(err.value)
        assert "\n" not in msg and msg.startswith(what), msg
        assert "SGLangTarget target only captures" in msg and "target.backend=transformers" in msg


def test_require_decoding_passes_a_decoding_target_through():
    target = tiny_target()
    assert require_decoding(target, "x") is target
    assert target.max_positions == 512
    assert target.eos_ids() == frozenset()  # a bare-id target has no reply end
    out = target.generate(torch.tensor([[1, 2, 3]]), 4)
    assert out.shape == (1, 7)
