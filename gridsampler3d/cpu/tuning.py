"""Tuning constants of the CPU engine (they change speed, never results)."""

# Channels-last data with at least this many channels runs the channel loop innermost
# (contiguous, vectorised); fewer channels keep the points as the vector lanes instead.
VECTOR_CHANNELS = 4

# Output points per block of phase A (coordinates, weights, offsets): the block's
# structure-of-arrays scratch, about 30 arrays of this many 8-byte entries per thread,
# stays in the L1 cache.
BLOCK = 128
PLAN_SAMPLES = 1 << 16
