import importlib.util
import os

import torch

# Without a GPU, run the Triton kernels through Triton's CPU interpreter: it must be chosen
# before Triton is first imported.
if importlib.util.find_spec("triton") is not None and not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
from helpers import CPU_BACKENDS  # noqa: E402

from gridsampler3d.cpu import tuning  # noqa: E402

# The CPU engine runs a call with fewer output values than this as one part on the calling
# thread (test_cpu checks that route and this threshold).
DEFAULT_PARALLEL_VALUES = tuning.PARALLEL_VALUES


def pytest_collection_modifyitems(items):
    """Tests marked slow start first, the rest in collection order. `make test` runs pytest-xdist with work
    stealing: a worker that runs out takes the tests still waiting at the end of another's queue, so with the slow
    ones first, what is left at the end is quick tests, and the workers finish together instead of one running a
    late slow test alone."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture
def split_small_calls(monkeypatch):
    """Split even a small call into parts on the engine's threads, as a large call is split, and plan it on one
    thread as a large volume is planned.

    For the modules that check, on the small volumes tests can afford, what the split does:
    results against the golden and across thread counts, every element written.
    """
    monkeypatch.setattr(tuning, "PARALLEL_VALUES", 0)
    monkeypatch.setattr(tuning, "SERIAL_ITEM_BYTES", 0)


@pytest.fixture
def threads():
    """Set torch's (and so the engine's) thread count inside a test, restoring it after."""
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


@pytest.fixture(params=CPU_BACKENDS)
def cpu_backend(request):
    """Every backend that runs on CPU tensors here (Triton through its interpreter when there is no GPU)."""
    return request.param
