import os

import pytest
import torch

# Without CUDA, Triton kernels can only run under Triton's interpreter (tests/test_kernel_verify.py
# runs them on CPU tensors against their references). It must be on before triton is first
# imported: @triton.jit reads it when a kernel is decorated. The dispatchers never call a kernel on
# CPU tensors, so nothing else in the suite goes through it.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# The integration tier: tests that load the real embedded target or all of chitchat, run the CLI
# end to end in subprocesses, start process groups, or build/download wheels. Everything else is
# the unit tier (tiny random models, hand-set logits), `pytest -m "not integration"`. Keys are
# node id prefixes under tests/: a whole file, or tests (every parametrization) by name prefix.
INTEGRATION = {
    "test_real_target.py": "loads SmolLM2-135M and trains on chitchat",
    "test_cli.py": "train/dump/eval/export CLI runs in subprocesses",
    "test_cli_errors.py": "CLI subprocesses (each pays the interpreter and torch import)",
    "test_sweep.py": "a Hydra multirun sweep through the CLI",
    "test_split.py": "torchrun jobs of 3 processes over gloo",
    "test_watchdog.py": "spawned gloo ranks that fail on purpose",
    "test_channel.py::test_p2p_gloo_producer_to_consumer": "gloo process group",
    "test_channel.py::test_fan_in_and_fan_out_over_gloo": "gloo process group",
    "test_channel.py::test_p2p_control_on_one_group_payloads_on_another": "gloo process group",
    "test_wheel_install.py": "builds the wheel and installs it into a fresh venv",
    "test_sglang_contract.py": "downloads the sglang 0.5.23 wheel (cached) and runs its loader",
    "test_sglang_backend.py::test_every_sglang": "parses the downloaded sglang wheel",
    "test_sglang_backend.py::test_every_attribute": "parses the downloaded sglang wheel",
    "test_vllm_layout_contract.py": "downloads the vllm 0.33.0 wheel (cached) and runs its draft-input code",
    "test_sglang_layout_contract.py": "runs sglang 0.5.23's draft-input code from its downloaded wheel",
    "test_hybrid_layout_contract.py": "runs both wheels' capture code for every served hybrid target class",
    "test_export_speculators.py::test_vllm_own": "reads the downloaded vllm wheel",
    "test_export_eagle3_engines.py": "runs vllm 0.33.0's and sglang 0.5.23's EAGLE-3 code from their downloaded wheels",
    "test_hybrid_serving.py::test_table_matches_vllm": "reads the downloaded vllm wheel",
    "test_gen_remote.py": "a live server, and gen runs killed and resumed in subprocesses",
    "test_data.py::test_chitchat_conversion": "converts all 7,168 chitchat conversations",
    "test_target_matrix.py::test_served_architecture": "trains and evaluates every architecture",
    "test_target_arch.py::test_cli_refusal_is_one_line": "a CLI subprocess",
}


def pytest_collection_modifyitems(config, items):
    for item in items:
        node = item.nodeid.removeprefix("tests/")
        if node.startswith(tuple(INTEGRATION)):
            item.add_marker(pytest.mark.integration)


@pytest.fixture
def triton_numpy_fix(monkeypatch):
    """triton <= 3.6's interpreter makes a scalar argument used as a loop bound (range(steps)) an
    int with int(one-element array), which NumPy 2.4 refuses ("only 0-dimensional arrays can be
    converted to Python scalars"); this applies the upstream fix (triton-lang/triton#9171, in 3.7).
    Kernel test modules opt in (tests/triton_cpu.py); nothing to do on CUDA."""
    if torch.cuda.is_available():
        return
    try:
        from triton.runtime import interpreter
    except ImportError:
        return
    if not hasattr(interpreter, "_patch_lang_tensor"):
        return
    patch_tensor = interpreter._patch_lang_tensor

    def patched(tensor, scope):
        patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))

    monkeypatch.setattr(interpreter, "_patch_lang_tensor", patched)


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models: on a shared CPU, intra-op thread hand-offs cost more than the work itself.
    A module opts in with `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    from transformers import AutoTokenizer

    from splitserve.assets import smollm2_dir

    return AutoTokenizer.from_pretrained(smollm2_dir())


@pytest.fixture(scope="session")
def tiny_smol_dir(tmp_path_factory):
    """A tiny random Llama with SmolLM2's tokenizer (V=49152) saved as an HF directory, so the
    real CLI paths (chat templates, prompts, export) run in seconds."""
    from tiny import save_tiny_smol

    return save_tiny_smol(tmp_path_factory.mktemp("tiny_smol"))
