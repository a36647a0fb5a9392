"""Checks of the CPU engine's place in a process, each run as its own program (tests/test_runtime.py).

    python tests/runtime_checks.py CHECK

- ``import``: importing the package after numba and torch changes no Numba setting, loads
  no shared library (Python modules aside) and starts no thread; nor does running its
  kernels start a Numba threading layer or load one.
- ``user-layer``: the threading layer the user's own Numba code chose is the one it runs
  on, before and after the engine's calls (``NUMBA_THREADING_LAYER`` set by the caller).
- ``plain``: the engine on Numba's public API alone (``GRIDSAMPLER3D_PLAIN_NUMBA=1`` set
  by the caller) against PyTorch: float64 bit for bit, float32 by the precision rule;
  nothing written to the disk cache; ``gridsampler3d backends`` says "plain".
- ``missing-hook``: with a method the hooks override taken out of Numba, the import warns
  once, naming Numba's version, and takes the plain path.
- ``checksum``: a tricubic and a trilinear forward of a fixed case, printed as two sums.

Each prints "ok" last when it passed.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import threading
from pathlib import Path

import numba
import torch

# (mode, padding, align_corners, data_format) of the plain path's check
PLAIN_CASES = (
    ("bilinear", "zeros", False, "NCDHW"),
    ("nearest", "reflection", True, "NCDHW"),
    ("bilinear", "border", False, "NDHWC"),
    ("bicubic", "reflection", False, "NCDHW"),
)
# The (mode, data_format) whose float32 kernels the plain path's check compiles too: trilinear, NCDHW (each case
# compiles anew, about 7 s). float32's rounding per mode and layout is the hooks path's (tests/test_matrix.py); the
# plain path compiles the same sources, and the float64 cases above compile each layout's kernels on it.
PLAIN_FLOAT32 = (("bilinear", "NCDHW"),)


def _case(dtype=torch.float64, data_format="NCDHW", seed=0):
    """(grad, x, grid): odd sizes, a grid reaching past the volume."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 3, 7, 6, 5, generator=generator, dtype=torch.float64)
    grid = torch.rand(2, 5, 4, 6, 3, generator=generator, dtype=torch.float64) * 2.6 - 1.3
    grad = torch.randn(2, 3, 5, 4, 6, generator=generator, dtype=torch.float64)
    if data_format == "NDHWC":
        x, grad = (tensor.permute(0, 2, 3, 4, 1).contiguous() for tensor in (x, grad))
    return grad.to(dtype), x.to(dtype), grid.to(dtype)


def _run_every_kind_of_kernel() -> None:
    """Forward and backward, trilinear and tricubic, and bfloat16's rounding pass, on two threads."""
    import gridsampler3d as gs
    from gridsampler3d.cpu import tuning

    tuning.PARALLEL_VALUES = 0  # small calls split into parts anyway
    torch.set_num_threads(2)
    for mode, dtype in (("bilinear", torch.float32), ("bicubic", torch.float64), ("bilinear", torch.bfloat16)):
        grad, x, grid = _case(dtype)
        gs.grid_sampler3d(x, grid, mode, backend="numba")
        gs.grid_sampler3d_backward(grad, x, grid, mode, backend="numba")


def _numba_state() -> dict:
    """Numba's process-wide settings (read without starting anything)."""
    config = numba.config
    return {
        "THREADING_LAYER": config.THREADING_LAYER,
        "THREADING_LAYER_PRIORITY": config.THREADING_LAYER_PRIORITY,
        "NUMBA_NUM_THREADS": config.NUMBA_NUM_THREADS,
        "CACHE_DIR": config.CACHE_DIR,
    }


def _libraries() -> set[str]:
    """The shared libraries mapped into this process, Python's extension modules (imports) left out."""
    with open("/proc/self/maps") as maps:
        paths = {fields[5].strip() for fields in (line.split(None, 5) for line in maps) if len(fields) == 6}
    return {path for path in paths if ".so" in Path(path).name and ".cpython-" not in path and ".abi3." not in path}


def _started_layer() -> str | None:
    try:
        return numba.threading_layer()
    except ValueError:  # no parallel launch yet
        return None


def check_import() -> None:
    state, libraries, threads = _numba_state(), _libraries(), threading.active_count()
    import gridsampler3d  # noqa: F401

    assert _numba_state() == state, (state, _numba_state())
    assert _libraries() == libraries, f"import loaded {sorted(_libraries() - libraries)}"
    assert threading.active_count() == threads, "import started a thread"
    _run_every_kind_of_kernel()
    assert _numba_state() == state, (state, _numba_state())
    assert _started_layer() is None, f"the engine started Numba's {_started_layer()} layer"
    loaded = _libraries() - libraries
    assert not [path for path in loaded if "tbb" in Path(path).name or "omp" in Path(path).name], sorted(loaded)


@numba.njit(parallel=True)
def _users_parallel_sum(values):
    total = 0.0
    for i in numba.prange(values.size):
        total += values[i]
    return total


def check_user_layer() -> None:
    chosen = os.environ["NUMBA_THREADING_LAYER"]
    values = torch.arange(1000, dtype=torch.float64).numpy()
    assert _users_parallel_sum(values) == 499500.0
    assert _started_layer() == chosen, _started_layer()
    _run_every_kind_of_kernel()
    assert _started_layer() == chosen and numba.config.THREADING_LAYER == chosen
    assert _users_parallel_sum(values) == 499500.0


def _same(ours, golden) -> bool:
    """Bit for bit, NaN where NaN."""
    nan = torch.isnan(golden)
    return ours.dtype == golden.dtype and torch.equal(torch.isnan(ours), nan) and torch.equal(ours[~nan], golden[~nan])


def check_plain() -> None:
    sys.path.insert(0, str(Path(__file__).parent))
    from helpers import assert_backward_matches, assert_forward_matches

    import gridsampler3d as gs
    from gridsampler3d import precision
    from gridsampler3d.cpu import jit
    from gridsampler3d.tools.cli import main

    assert jit.plain(), "the plain path was asked for"
    for mode, padding, align_corners, data_format in PLAIN_CASES:
        label = f"{mode} {padding} align_corners={align_corners} {data_format}"
        grad, x, grid = _case(torch.float64, data_format)
        attributes = (mode, padding, align_corners)
        y = gs.grid_sampler3d(x, grid, *attributes, data_format=data_format, backend="numba")
        dx, dgrid = gs.grid_sampler3d_backward(grad, x, grid, *attributes, data_format=data_format, backend="numba")
        golden = (
            precision.golden_forward(x, grid, *attributes, data_format),
            *precision.golden_backward(grad, x, grid, *attributes, (True, True), data_format),
        )
        for name, ours, gold in zip(("y", "dx", "dgrid"), (y, dx, dgrid), golden):
            assert _same(ours, gold), f"float64 {label} {name}: not bitwise the golden"
        if (mode, data_format) not in PLAIN_FLOAT32:
            continue  # every case compiles anew here (no disk cache): float32 for one kernel of each kind
        grad, x, grid = _case(torch.float32, data_format, seed=1)
        assert_forward_matches(x, grid, *attributes, data_format=data_format, backend="numba", label=label)
        assert_backward_matches(grad, x, grid, *attributes, data_format=data_format, backend="numba", label=label)
    cached = [path for path in Path(numba.config.CACHE_DIR).rglob("*") if path.suffix in (".nbi", ".nbc")]
    assert not cached, f"the plain path wrote to the disk cache: {cached[:3]}"
    listing = io.StringIO()
    with contextlib.redirect_stdout(listing):
        main(["backends"])
    assert "plain" in listing.getvalue(), listing.getvalue()
    print(listing.getvalue())


def check_missing_hook() -> None:
    import warnings

    from numba.core import dispatcher

    del dispatcher._FunctionCompiler._customize_flags  # as in a Numba release without it
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        from gridsampler3d.cpu import jit
    messages = [str(warning.message) for warning in caught if "gridsampler3d" in str(warning.message)]
    assert len(messages) == 1 and f"Numba {numba.__version__} lacks a hook" in messages[0], messages
    assert jit.plain() and "_customize_flags" in jit.compile_path(), jit.compile_path()


def check_checksum() -> None:
    import gridsampler3d as gs

    print(f"package {Path(gs.__file__).parent}")
    _, x, grid = _case(torch.float64)
    for mode in ("bicubic", "bilinear"):
        print(f"{mode} {float(gs.grid_sampler3d(x, grid, mode, backend='numba').sum())!r}")


CHECKS = {
    "import": check_import,
    "user-layer": check_user_layer,
    "plain": check_plain,
    "missing-hook": check_missing_hook,
    "checksum": check_checksum,
}

if __name__ == "__main__":
    CHECKS[sys.argv[1]]()
    print("ok")
