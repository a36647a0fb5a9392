"""Tuning constants of the CPU engine (they change speed, never results)."""

# Channels-last data with at least this many channels runs the channel loop innermost
# (contiguous, vectorised); fewer channels keep a point's taps in registers instead.
VECTOR_CHANNELS = 4

# plan_slabs estimates the work per dx plane from about this many points.
PLAN_SAMPLES = 1 << 16
