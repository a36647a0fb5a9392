"""The full attribute x dtype x layout matrix against the float64 golden (SPEC section 5)."""
import pytest

from helpers import DTYPE_IDS, DTYPES, MATRIX, assert_backward_matches, assert_forward_matches, make_case, matrix_id


@pytest.mark.parametrize("data_format", ["NCDHW", "NDHWC"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS.get)
@pytest.mark.parametrize("attributes", MATRIX, ids=matrix_id)
def test_backward_and_forward_match_golden(attributes, dtype, data_format, cpu_backend):
    mode, padding, align_corners = attributes
    grad, x, grid = make_case(dtype=dtype, data_format=data_format, seed=MATRIX.index(attributes))
    label = f"{matrix_id(attributes)} {DTYPE_IDS[dtype]} {data_format} {cpu_backend}"
    assert_backward_matches(grad, x, grid, mode, padding, align_corners, data_format, cpu_backend, label=label)
    assert_forward_matches(x, grid, mode, padding, align_corners, data_format, cpu_backend, label=label)
