"""The full attribute x dtype x layout matrix against the float64 golden, by the precision rule (docs/semantics.md).

The CPU engines run every case; Triton's interpreter (no GPU) a quarter of them, in rotation (helpers.in_rotation):
every attribute set in both layouts, every dtype with every mode, padding, align_corners and layout.
test_gpu.py's deterministic matrix takes another quarter.
"""

import pytest
import torch
from helpers import (
    CPU_BACKENDS,
    DTYPE_IDS,
    DTYPES,
    LAYOUTS,
    MATRIX,
    assert_backward_matches,
    assert_forward_matches,
    in_rotation,
    make_case,
    matrix_id,
)

# The engine splits even these small calls into parts on its threads, as it splits a large one.
pytestmark = pytest.mark.usefixtures("split_small_calls")

CASES = [
    (backend, attributes, dtype, data_format)
    for backend in CPU_BACKENDS
    for attributes in MATRIX
    for dtype in DTYPES
    for data_format in LAYOUTS
    if backend != "triton" or in_rotation(attributes, dtype, data_format)
]


@pytest.mark.parametrize(
    "cpu_backend, attributes, dtype, data_format",
    CASES,
    ids=[f"{b}-{matrix_id(a)}-{DTYPE_IDS[d]}-{f}" for b, a, d, f in CASES],
)
def test_backward_and_forward_match_golden(attributes, dtype, data_format, cpu_backend):
    mode, padding, align_corners = attributes
    grad, x, grid = make_case(dtype=dtype, data_format=data_format, seed=MATRIX.index(attributes))
    label = f"{matrix_id(attributes)} {DTYPE_IDS[dtype]} {data_format} {cpu_backend}"
    assert_backward_matches(grad, x, grid, mode, padding, align_corners, data_format, cpu_backend, label=label)
    assert_forward_matches(x, grid, mode, padding, align_corners, data_format, cpu_backend, label=label)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=DTYPE_IDS.get)
@pytest.mark.parametrize("attributes", MATRIX, ids=matrix_id)
def test_channels_last_with_many_channels(attributes, dtype, cpu_backend):
    """Enough contiguous channels for the CPU engine's vectorised channel loops."""
    mode, padding, align_corners = attributes
    grad, x, grid = make_case(2, 9, (5, 6, 4), (4, 3, 5), dtype, "NDHWC", seed=MATRIX.index(attributes))
    label = f"{matrix_id(attributes)} {DTYPE_IDS[dtype]} NDHWC C=9 {cpu_backend}"
    assert_backward_matches(grad, x, grid, mode, padding, align_corners, "NDHWC", cpu_backend, label=label)
    assert_forward_matches(x, grid, mode, padding, align_corners, "NDHWC", cpu_backend, label=label)
