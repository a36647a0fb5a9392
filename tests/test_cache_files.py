"""The engine's disk cache never pairs one entry's key with another entry's compiled code."""

import pytest

numba_hooks = pytest.importorskip("gridsampler3d.cpu.numba_hooks", reason="the plain path has no disk cache")


def test_two_processes_saving_at_once_never_swap_their_kernels(tmp_path):
    """Two writers that read the index before either saved (two processes compiling two modes' kernels at once)."""
    first = numba_hooks._KeyNamedCacheFile(str(tmp_path), "kernel-1.py311", "stamp")
    second = numba_hooks._KeyNamedCacheFile(str(tmp_path), "kernel-1.py311", "stamp")
    stale = second._load_index()  # empty: read before the first writer saved
    first.save(("zeros",), b"the zeros kernel")
    second._load_index = lambda: dict(stale)
    second.save(("border",), b"the border kernel")
    # Each entry's code has a file of its own: Numba's numbering gave both the first free number, and the second
    # writer's data replaced the first's under a name the first's index still held.
    assert len(list(tmp_path.glob("*.nbc"))) == 2
    reader = numba_hooks._KeyNamedCacheFile(str(tmp_path), "kernel-1.py311", "stamp")
    # The last index written lacks the first entry (it compiles again), but never names the other's code.
    assert reader.load(("zeros",)) in (b"the zeros kernel", None)
    assert reader.load(("border",)) == b"the border kernel"
    first.save(("zeros",), b"the zeros kernel")
    assert reader.load(("zeros",)) == b"the zeros kernel" and reader.load(("border",)) == b"the border kernel"
