"""The CPU engine's cache of released output blocks (gridsampler3d.cpu.buffers)."""

import gc

import pytest
import torch

import gridsampler3d as gs
from gridsampler3d.cpu import buffers, tuning

# The engine splits even these small calls into parts on its threads, as it splits a large one.
pytestmark = pytest.mark.usefixtures("split_small_calls")


@pytest.fixture(autouse=True)
def empty_cache(monkeypatch):
    monkeypatch.setattr(tuning, "CACHED_BYTES", 64 << 20)
    monkeypatch.setattr(tuning, "CACHED_MIN_BYTES", 1 << 12)
    buffers.release()
    yield
    buffers.release()


def _inputs(dtype=torch.float32, channels_last=False):
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(1, 4, 12, 14, 16, generator=generator, dtype=dtype)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last_3d)
    grid = (torch.rand(1, 10, 20, 30, 3, generator=generator, dtype=torch.float64) * 2.2 - 1.1).to(dtype)
    return x, grid


@pytest.mark.parametrize("channels_last", [False, True])
def test_a_released_output_is_reused_and_fully_rewritten(channels_last):
    x, grid = _inputs(channels_last=channels_last)
    expected = torch.nn.functional.grid_sample(x.double(), grid.double(), "bilinear", "zeros", False)
    first = gs.grid_sampler3d(x, grid, backend="numba")
    layout = torch.channels_last_3d if channels_last else torch.contiguous_format
    assert first.stride() == torch.empty(first.shape, memory_format=layout).stride()
    address = first.data_ptr()
    first.fill_(float("nan"))  # what the next call finds in the block
    del first
    gc.collect()
    assert buffers.cached_bytes() >= x.shape[1] * 10 * 20 * 30 * 4
    second = gs.grid_sampler3d(x, grid, backend="numba")
    assert second.data_ptr() == address
    assert buffers.cached_bytes() == 0
    torch.testing.assert_close(second.double(), expected, rtol=1e-5, atol=1e-5)


def test_backward_outputs_come_back_and_are_rewritten():
    x, grid = _inputs()
    grad = torch.randn(1, 4, 10, 20, 30, generator=torch.Generator().manual_seed(4))
    dx, dgrid = gs.grid_sampler3d_backward(grad, x, grid, backend="numba")
    expected = (dx.clone(), dgrid.clone())
    dx.fill_(float("nan"))
    dgrid.fill_(float("inf"))
    del dx, dgrid
    again = gs.grid_sampler3d_backward(grad, x, grid, backend="numba")
    assert buffers.cached_bytes() == 0  # both blocks taken again
    assert all(torch.equal(result, before) for result, before in zip(again, expected))


def test_a_live_view_keeps_its_block():
    x, grid = _inputs()
    first = gs.grid_sampler3d(x, grid, backend="numba")
    kept = first[:, 1:3]
    values = kept.clone()
    del first
    gc.collect()
    assert buffers.cached_bytes() == 0
    second = gs.grid_sampler3d(x, 0.5 * grid, backend="numba")
    assert second.data_ptr() != kept.data_ptr()
    assert torch.equal(kept, values)
    del kept
    gc.collect()
    assert buffers.cached_bytes() > 0


def test_the_cache_keeps_at_most_its_limit(monkeypatch):
    monkeypatch.setattr(tuning, "CACHED_BYTES", 1 << 20)
    blocks = [buffers.empty((1 << 16,), torch.float32) for _ in range(6)]  # 256 KiB each
    del blocks
    gc.collect()
    assert 0 < buffers.cached_bytes() <= 1 << 20
    buffers.release()
    assert buffers.cached_bytes() == 0


def test_half_precision_temporaries_come_back_and_the_cache_turns_off(monkeypatch):
    x, grid = _inputs(torch.bfloat16)
    y = gs.grid_sampler3d(x, grid, backend="numba")
    assert y.dtype == torch.bfloat16
    gc.collect()
    assert buffers.cached_bytes() > 0  # the float64 operands and result went back
    monkeypatch.setattr(tuning, "CACHED_BYTES", 0)
    buffers.release()
    del y
    gc.collect()
    assert buffers.cached_bytes() == 0


def test_freed_blocks_are_trimmed_at_once_and_oversized_ones_not_kept(monkeypatch):
    monkeypatch.setattr(tuning, "CACHED_BYTES", 1 << 20)
    huge = buffers.empty((1 << 19,), torch.float32)  # 2 MiB: more than the whole cache
    kept = [buffers.empty((1 << 16,), torch.float32) for _ in range(6)]
    del huge, kept
    gc.collect()
    # No call since: the finalisers themselves held the cache to its limit.
    assert len(buffers._returned) == 0
    assert 0 < buffers._free_bytes <= 1 << 20


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_half_precision_tensors_come_from_the_cache_too(dtype):
    """The channels-last copies of half data (cpu.transpose) take cached blocks: dtype and strides as asked."""
    first = buffers.empty((2, 3, 40, 50, 60), dtype, torch.channels_last_3d)
    layout = torch.empty(first.shape, memory_format=torch.channels_last_3d).stride()
    assert first.dtype == dtype and first.stride() == layout
    first.fill_(1.5)
    assert torch.equal(first, torch.full(first.shape, 1.5, dtype=dtype))
    address = first.data_ptr()
    del first
    gc.collect()
    second = buffers.empty((2, 3, 40, 50, 60), dtype)
    assert second.data_ptr() == address and second.dtype == dtype and second.is_contiguous()
