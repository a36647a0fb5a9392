"""The report of what a first call compiles (gridsampler3d/cpu/compile_report.py), as the commands print it."""

import numba
import numpy as np

from gridsampler3d.cpu.compile_report import reporting_compiles


def _fresh_kernels():
    """A kernel calling a helper, both new dispatchers: their first call compiles them (no disk cache)."""

    @numba.njit
    def helper(values):
        return values.sum()

    @numba.njit
    def kernel(values):
        return helper(values) * 2.0

    return kernel


def test_each_outermost_compile_is_named_as_it_starts_and_timed():
    kernel = _fresh_kernels()
    lines = []
    with reporting_compiles(lines.append) as report:
        assert kernel(np.ones(4)) == 8.0
    # the helper compiles inside the kernel's compile: one kernel, named once
    assert report.names == ["test_compile_report._fresh_kernels.kernel float64"]
    assert lines == [
        "compiling 1: test_compile_report._fresh_kernels.kernel float64 (once: later runs load it from the disk cache)"
    ]
    assert report.seconds > 0 and "compiled 1 kernel once in" in report.summary()
    # compiled already: the next call compiles nothing, and says so
    with reporting_compiles(lines.append) as again:
        kernel(np.ones(4))
    assert again.names == [] and again.seconds == 0.0 and "no kernel compiled" in again.summary()
    assert len(lines) == 1


def test_without_an_echo_the_report_still_counts():
    kernel = _fresh_kernels()
    with reporting_compiles() as report:
        kernel(np.ones(3))
        kernel(np.ones((2, 2)))  # another signature: a second compile of the same kernel
    assert len(report.names) == 2 and report.watched


def test_an_engine_kernel_is_named_by_its_mode_and_counted_against_what_was_expected():
    """The kernels the engine builds per mode say which mode and dtype they are; with ``expected`` the count says
    out of how many ("compiling 1/2: backward trilinear border align_corners displacement NCDHW float64")."""
    from gridsampler3d.cpu import backward, forward
    from gridsampler3d.modes import Interpolation, Padding
    from gridsampler3d.sampling import FieldKind, Sampling

    sampling = Sampling(Interpolation.BILINEAR, Padding.BORDER, True)
    made = backward.backward_kernel(sampling, FieldKind.DISPLACEMENT)
    assert made.part.py_func.compile_label == "backward trilinear border align_corners displacement NCDHW"
    made = forward.forward_kernel(sampling, FieldKind.AFFINE_DISPLACEMENT, channels_last=True, exact_remainder=True)
    expected = "forward trilinear border align_corners affine+displacement channels-last (exact remainder)"
    assert made.part.py_func.compile_label == expected
    from gridsampler3d.cpu.compile_report import _described

    assert _described(made.part, ("array(float64, 1d, C)", "int64")) == expected + " float64"
    lines = []
    with reporting_compiles(lines.append, expected=2):
        _fresh_kernels()(np.ones(4))
        _fresh_kernels()(np.ones(4))
    assert [line.split(":")[0] for line in lines] == ["compiling 1/2", "compiling 2/2"]
