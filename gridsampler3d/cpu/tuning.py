"""Tuning constants of the CPU engine (they change speed, never results)."""

# Channels-last data with at least this many channels runs the channel loop innermost
# (contiguous, vectorised); fewer channels keep the points as the vector lanes instead.
VECTOR_CHANNELS = 4

# Output points per block of phase A (coordinates, weights, offsets): the block's
# structure-of-arrays scratch, about 30 arrays of this many 8-byte entries per thread,
# stays in the L1 cache.
BLOCK = 128
PLAN_SAMPLES = 1 << 16

# A call with fewer output values (points times channels) than this runs as one part on
# the calling thread: handing a part to another thread costs about 0.1 ms, which a
# smaller call would not win back.
PARALLEL_VALUES = 1 << 15
