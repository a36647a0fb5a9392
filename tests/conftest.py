import pytest

import gridsampler3d as gs

CPU_BACKENDS = [name for name in gs.available_backends() if name in ("reference", "numba")]


@pytest.fixture(params=CPU_BACKENDS)
def cpu_backend(request):
    """Every backend that runs on CPU tensors here."""
    return request.param
