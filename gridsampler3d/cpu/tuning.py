"""Tuning constants of the CPU engine (they change speed, never results)."""

import operator
import os

# Channels-last data with at least this many channels runs the channel loop innermost
# (contiguous, vectorised); fewer channels keep the points as the vector lanes instead.
VECTOR_CHANNELS = 4

# Output points per block of phase A (coordinates, weights, offsets): the block's
# structure-of-arrays scratch, about 30 arrays of this many 8-byte entries per thread,
# stays in the L1 cache.
BLOCK = 128

# Output rows shorter than a block are walked several at a time, as one row of at most
# this many points, where the strides allow (planner._rows_joined): the blocks fill and
# the channel loops run once per block, not once per short row (one thread, 64-wide
# rows in pairs: forward 0.86 to 0.92 of the time, backward 0.78 (near64) to 0.97).
LONG_ROW_POINTS = 1024

# A call with fewer output values (points times channels) than this runs as one walk on
# the calling thread: handing parts to another thread (about 0.1 ms) and its operands to
# another core's caches costs more than a second thread wins back. Float32 bilinear
# backward at two threads, the walk on the calling thread against the plan for two
# threads: 55,296 and 65,536 values 0.61 to 0.84 of the time (random and affine grids;
# N=8 C=2 16³, N=2 C=2 24³, C=2 32³); 110,592 to 131,072 values 0.81 to 0.95 on random
# grids but 1.06 to 1.12 on affine ones (N=4 C=2 24³, C=4 32³, N=2 C=2 32³).
PARALLEL_VALUES = 3 << 15
# On one thread, a call whose every batch item's planes (x's and dx's: channels x D x H x W
# in the kernels' dtype, each) fit in this many bytes runs as that walk too, at any size:
# a random grid's scatter then stays in the cache, so the one walk beats a pass per output,
# and the smoothness verdict and fresh scratch would buy nothing. Float32 bilinear
# backward, one thread, the walk against the planned passes or fused walk: items of 0.06
# to 1 MiB 0.69 to 0.81 of the time; 1.5 MiB 0.87 to 1.01; 1.7 to 2 MiB 1.11 to 1.42 on
# random grids (0.92 to 0.94 on affine ones).
SERIAL_ITEM_BYTES = 1 << 20

# At several threads, a pass by rows (the forward, the grid gradient) runs as this many
# runs of rows per thread, each taken by whichever thread is free (beside dx, by the dx
# threads too once their slabs are done): with one fixed part per thread, one part
# often ended 10 to 60% after the other, and the grid gradient beside dx took up to
# twice dx's time (cl64, channels-last: 29 ms against 15 ms at two threads), the other
# thread waiting (docs/cpu.md, "Runs of rows, taken in turn").
SHARED_RUNS = 8
# ... but no run of fewer output values (points times channels) than this: each run is a
# kernel call from Python (about 10 us, under the GIL), which a batch of small crops paid
# sixteen times (N=8, C=2, 16³ forward at two threads: 709 us in 16 runs, 468 us before
# the kernels took records).
RUN_VALUES = 1 << 15

# One thread computes dx and dgrid of a smooth grid in one walk only below this many
# channels: with more, each block's walk over every channel's taps, grad and dx
# outgrows the caches, and a pass per output is faster (one thread, the fused walk
# against the two passes: feat48 (32 channels) 0.91, fp64 (8) 0.76, cl64 and bf16 (16)
# 1.01 and 0.98 of the time; reg128 and warp128 (1) 1.04 and 1.12, up2x (4) 1.03).
FUSED_CHANNELS = 8

# A bilinear backward of dense NCDHW float32 data with at least COPIED_CHANNELS channels
# (half data: COPIED_HALF_CHANNELS), on a smooth grid, runs the channels-last kernels on
# channels-last copies of grad and x and copies dx back (planner._copies_pay): each tap's
# channels are then one vector load and one vector read-modify-write of dx, where NCDHW
# loads and adds them one by one (docs/cpu.md, "Channels-last copies"). Copies against
# none, 64³ affine grid, 1 and 2 threads: float32 with 4, 8, 12 and 16 channels 1.67 /
# 1.83, 1.01 / 1.40, 1.01 / 1.06, 0.82 / 0.80 of the time; bfloat16 (whose copies move
# two-byte elements, where the NCDHW kernels read float64 copies) 1.19 / 1.40, 0.72 /
# 0.85, 0.82 / 0.81, 0.70 / 0.68.
COPIED_CHANNELS = 16
COPIED_HALF_CHANNELS = 8

# The passes over a random grid (forward, grid gradient, dx), in NCDHW, take this many
# bytes of channel planes at a time: a random grid's taps land all over each plane, and
# with every channel's plane in play at once nearly every gather and read-modify-write
# missed the caches (rand64, one thread, a plane at a time: the forward 0.42 to 0.46 and
# the backward 0.58 of the time). Each group computes the points' coordinates again, so
# a group of a few planes beats one plane while the group stays within a share of the L3
# cache: random grids over 64³ float32 planes of 1 MiB, groups of 1, 2, 4 and 8 planes,
# one thread: forward 44, 36, 32 and 34 ms, backward 172, 126, 98 and 116 ms; 32³ planes
# with 64 channels: 8 to 64 planes per group within 10%; 96³ planes (3.4 MiB): 1 and 2
# planes alike, 4 planes 1.7 times the time.
SCATTER_CACHE_BYTES = 4 << 20

# The grid gradient's groups of channels carry each point's three float64 sums from one
# group to the next; they run over chunks of rows whose sums take at most this many bytes,
# each chunk reading the channels' planes again (rand64's grid gradient, one thread: 145
# ms with its 6 MiB of sums in one chunk, 165 ms in chunks of 4 MiB, 213 ms in one pass).
CARRY_BYTES = 16 << 20

# Released output blocks kept resident for later calls (.buffers), in bytes; 0 turns the
# cache off. GRIDSAMPLER3D_CPU_CACHE_MB sets it at import. Outputs smaller than
# CACHED_MIN_BYTES come from torch.empty: malloc reuses such blocks itself.
CACHED_BYTES = int(float(os.environ.get("GRIDSAMPLER3D_CPU_CACHE_MB", "256")) * (1 << 20))
CACHED_MIN_BYTES = 1 << 20


def hardware_gathers_pay(cpu_name: str) -> bool:
    """Whether the kernels' indexed loads (the taps) should be hardware gathers on CPU ``cpu_name`` (LLVM's name).

    Intel's AVX-512 gathers (Skylake-SP and later Xeons) are what the kernels were tuned
    with. AMD Zen microcodes them: on Zen 4 (``znver4``) the same kernels built with
    scalar loads per lane took 0.57 to 0.98 of the one-thread forward's time and 0.72 to
    0.92 of the backward's (docs/cpu.md, "Gathers"), so every Zen CPU gets scalar loads.
    """
    return not cpu_name.startswith("znver")


_NAMES = tuple(name for name in globals() if name.isupper())
_CONSTANTS = operator.itemgetter(*_NAMES)


def values() -> tuple:
    """The constants' values now: part of the key of whatever is kept from one call for the next (a test may
    change them)."""
    return _CONSTANTS(globals())
