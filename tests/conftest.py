import os

import pytest
import torch

# Without CUDA, Triton kernels can only run under Triton's interpreter (tests/test_kernel_verify.py
# runs them on CPU tensors against their references). It must be on before triton is first
# imported: @triton.jit reads it when a kernel is decorated. The dispatchers never call a kernel on
# CPU tensors, so nothing else in the suite goes through it.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
from transformers import AutoTokenizer

from splitserve.assets import smollm2_dir


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
    return AutoTokenizer.from_pretrained(smollm2_dir())


@pytest.fixture(scope="session")
def tiny_smol_dir(tmp_path_factory):
    """A tiny random Llama with SmolLM2's tokenizer (V=49152) saved as an HF directory, so the
    real CLI paths (chat templates, prompts, export) run in seconds."""
    from tiny import save_tiny_smol

    return save_tiny_smol(tmp_path_factory.mktemp("tiny_smol"))
