"""Coordinate rules of the CPU engine: unnormalise, pad (clip / reflect), their slopes.

Scalar Numba twins of :mod:`gridsampler3d.reference`'s vectorised rules, written with the
same operations in the same order, in float64, so that the engine's indices and
multipliers equal the golden's bit for bit. The kernels call these and nothing else for
coordinates.
"""

from __future__ import annotations

import numpy as np

from ..modes import Interpolation, Padding
from ..reference import CUBIC_A, INT_MAX, INT_MIN, OUT_OF_RANGE
from ..sampling import FieldKind
from .jit import helper

# The records' codes as the plain ints the kernels compare with (a Numba kernel takes in a global's value).
BILINEAR, NEAREST = int(Interpolation.BILINEAR), int(Interpolation.NEAREST)
ZEROS, BORDER, REFLECTION = int(Padding.ZEROS), int(Padding.BORDER), int(Padding.REFLECTION)
GRID, DISPLACEMENT = int(FieldKind.GRID), int(FieldKind.DISPLACEMENT)
AFFINE, AFFINE_DISPLACEMENT = int(FieldKind.AFFINE), int(FieldKind.AFFINE_DISPLACEMENT)
BSPLINE, BSPLINE_AFFINE = int(FieldKind.BSPLINE), int(FieldKind.BSPLINE_AFFINE)

# The rules below are helpers (jit.py): LLVM inlines them into each kernel, where they fold
# with the kernel's compile-time modes; Numba's IR inliner would cost several times the compile time.


@helper
def reflect_with_grad(index, twice_low, twice_high, exact=True):
    """Reflect about [twice_low / 2, twice_high / 2]: (index, gradient sign, resolved).

    With ``exact`` False the remainder is taken without ``fmod`` (a libm call that stops
    a loop from vectorising): exact, by Sterbenz's lemma, for an index within two spans
    of the low bound, and ``resolved`` (1 or 0) is 0 for any other (infinity included),
    to be recomputed with ``exact`` True. NaN gives NaN either way. Resolved results are
    bitwise those of the exact rule.
    """
    # A single voxel (align_corners) reflects everything to 0; selected at the end, not
    # returned early: an early return per axis is a branch that keeps the loop scalar.
    degenerate = twice_low == twice_high
    low = twice_low * 0.5
    span = (twice_high - twice_low) * 0.5
    shifted = index - low
    negative = shifted < 0
    distance = -shifted if negative else shifted
    flips = np.floor(distance / span)
    if exact:
        extra = np.fmod(distance, span)
        resolved = 1
    else:
        extra = distance if distance < span else distance - span
        resolved = np.int64(not distance >= span + span)
    # C++ casts the flip count to int: past INT_MAX (or NaN) it is INT_MIN, which is even.
    odd = (flips <= INT_MAX) & (flips - 2.0 * np.floor(flips * 0.5) == 1.0)
    sign = (-1.0 if negative else 1.0) * (-1.0 if odd else 1.0)
    index = (span - extra + low) if odd else (extra + low)
    return (0.0 if degenerate else index), (0.0 if degenerate else sign), resolved | np.int64(degenerate)


@helper
def clip_with_grad(index, size):
    """Clip to [0, size - 1]; the bounds count as outside (gradient 0); NaN passes with 1."""
    upper = float(size - 1)
    below = index <= 0
    above = index >= upper
    clipped = 0.0 if below else (upper if above else index)
    return clipped, 0.0 if below | above else 1.0


@helper
def to_safe_range(index):
    """NaN, +-inf and values outside the int32 range become an out-of-bounds index."""
    usable = (index <= INT_MAX - 1) & (index >= INT_MIN)
    return index if usable else OUT_OF_RANGE


@helper
def source_index(coord, size, padding, align_corners, forward, exact=True, field=GRID, origin=0.0):
    """Voxel index and d index / d coord of one coordinate of a field of kind ``field`` along ``size`` voxels.

    A grid's coordinate is normalised. Any other field's (a displacement's) is in voxels from
    ``origin``: the index is ``origin + coord`` and its slope 1, before padding; an affine field
    without a displacement has no ``coord``: its index is ``origin``.

    Returns (index, multiplier, resolved); ``resolved`` is 0 only where ``exact`` is
    False and reflection needs the exact remainder (see :func:`reflect_with_grad`), else 1.
    ``forward`` selects PyTorch's forward treatment of a NaN under border/reflection
    padding (clipped to ``size - 1``); the backward lets it fall out of range. Written
    without data-dependent branches, so that loops over points vectorise.
    """
    if field == AFFINE:
        index = origin
        multiplier = 1.0
    elif field != GRID:
        index = origin + coord
        multiplier = 1.0
    elif align_corners:
        index = (coord + 1.0) * 0.5 * (size - 1)
        multiplier = (size - 1) * 0.5
    else:
        index = ((coord + 1.0) * size - 1.0) * 0.5
        multiplier = size * 0.5
    resolved = 1
    if padding == REFLECTION:
        if align_corners:
            index, sign, resolved = reflect_with_grad(index, 0, 2 * (size - 1), exact)
        else:
            index, sign, resolved = reflect_with_grad(index, -1, 2 * size - 1, exact)
        multiplier = multiplier * sign
    if padding != ZEROS:
        was_nan = index != index
        index, inside = clip_with_grad(index, size)
        multiplier = multiplier * inside
        if forward:
            index = float(size - 1) if was_nan else index
    return to_safe_range(index), multiplier, resolved


# ---- bicubic: padding applies to each tap, the point's index is only unnormalised ----


@helper
def unnormalize(coord, size, align_corners, field=GRID, origin=0.0):
    """(index, d index / d coord) of a coordinate of a field of kind ``field`` along ``size`` voxels
    (normalised for a grid; else in voxels from ``origin``, see :func:`source_index`)."""
    if field == AFFINE:
        return origin, 1.0
    if field != GRID:
        return origin + coord, 1.0
    if align_corners:
        return (coord + 1.0) * 0.5 * (size - 1), (size - 1) * 0.5
    return ((coord + 1.0) * size - 1.0) * 0.5, size * 0.5


@helper
def cubic_near(x):
    """Cubic convolution weight for |x| <= 1."""
    return ((CUBIC_A + 2) * x - (CUBIC_A + 3)) * x * x + 1


@helper
def cubic_far(x):
    """Cubic convolution weight for 1 < |x| < 2."""
    return ((CUBIC_A * x - 5 * CUBIC_A) * x + 8 * CUBIC_A) * x - 4 * CUBIC_A


@helper
def cubic_weight(step, t):
    """Weight of tap floor - 1 + ``step`` (0..3) at fraction ``t``, as PyTorch evaluates it."""
    if step == 0:
        return cubic_far(t + 1.0)
    if step == 1:
        return cubic_near(t)
    if step == 2:
        return cubic_near(1.0 - t)
    return cubic_far(2.0 - t)


@helper
def cubic_slope(step, t):
    """d weight / d t of :func:`cubic_weight` (PyTorch's gradient coefficient, negated)."""
    a = CUBIC_A
    if step == 0:
        x = -1.0 - t
        return -((-3 * a * x - 10 * a) * x - 8 * a)
    if step == 1:
        x = -t
        return -((-3 * (a + 2) * x - 2 * (a + 3)) * x)
    if step == 2:
        x = 1.0 - t
        return -((3 * (a + 2) * x - 2 * (a + 3)) * x)
    x = 2.0 - t
    return -((3 * a * x - 10 * a) * x + 8 * a)


@helper
def pad_tap(coord, size, padding, align_corners):
    """Where padding sends integer tap coordinate ``coord`` (PyTorch's compute_coordinates), as an int.

    Out of range (and anything unusable) comes back as an index outside [0, size).
    """
    if padding == REFLECTION:
        if align_corners:
            coord, _, _ = reflect_with_grad(coord, 0, 2 * (size - 1))
        else:
            coord, _, _ = reflect_with_grad(coord, -1, 2 * size - 1)
    if padding != ZEROS:
        coord, _ = clip_with_grad(coord, size)
    return int(to_safe_range(coord))
