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
    assert report.names == ["test_compile_report._fresh_kernels.kernel"]
    assert lines == [
        "compiling test_compile_report._fresh_kernels.kernel (once: later runs load it from the disk cache)"
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
