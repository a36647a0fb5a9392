"""An affine field's voxel matrix and theta's gradient, compiled: one kernel call each per call of the engine.

The formulas are :mod:`gridsampler3d.affine`'s own entry-wise functions
(:func:`.affine.voxel_entries`, :func:`.affine.theta_gradient_entries`), compiled here as
helpers: the same float64 operations in the same order, so the same bits as the NumPy
and torch paths (``tests/test_affine.py`` holds them to it). theta's gradient sums each
term of ``G`` over the output rows as NumPy's ``add.reduce`` sums a contiguous row: its
pairwise summation (:func:`pairwise_sum`), added to 0.0, so that the engine's dtheta keeps
the bits it had when NumPy summed it.
"""

from __future__ import annotations

import numpy as np

from ..affine import theta_gradient_entries, voxel_entries
from .jit import borrowed, helper, part_kernel

__all__ = ["pairwise_sum", "theta_gradient", "voxel_matrix"]

_voxel_entries = helper(voxel_entries)
_theta_gradient_entries = helper(theta_gradient_entries)

# NumPy's pairwise summation (umath's loops_utils): blocks of up to 128 values summed in 8 lanes, split in two
# (the first part a multiple of 8) above that.
_BLOCK = 128
_DEPTH = 64  # the explicit stack's depth: enough for 2^64 values


@helper
def _block_sum(values, start, count):
    """NumPy's pairwise sum of ``count`` <= 128 values from ``start``."""
    if count < 8:
        total = -0.0
        for i in range(count):
            total += values[start + i]
        return total
    # NumPy's eight lanes, by name: a scratch array here would be allocated for every block.
    r0, r1, r2, r3 = values[start], values[start + 1], values[start + 2], values[start + 3]
    r4, r5, r6, r7 = values[start + 4], values[start + 5], values[start + 6], values[start + 7]
    i = 8
    last = count - count % 8
    while i < last:
        at = start + i
        r0, r1, r2, r3 = r0 + values[at], r1 + values[at + 1], r2 + values[at + 2], r3 + values[at + 3]
        r4, r5, r6, r7 = r4 + values[at + 4], r5 + values[at + 5], r6 + values[at + 6], r7 + values[at + 7]
        i += 8
    total = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    while i < count:
        total += values[start + i]
        i += 1
    return total


@helper
def pairwise_sum(values, count, stack):
    """NumPy's pairwise sum of ``values[:count]``, its recursion run on ``stack`` ((3, 64) float64 scratch: each
    node's first value, count, and its left half's sum once known, a negative count marking it)."""
    if count <= _BLOCK:
        return _block_sum(values, 0, count)
    top = 0
    stack[0, 0], stack[1, 0] = 0.0, count
    while True:
        start, size = int(stack[0, top]), int(stack[1, top])
        if size > _BLOCK:  # go down the left half
            half = size // 2
            half -= half % 8
            top += 1
            stack[0, top], stack[1, top] = start, half
            continue
        total = _block_sum(values, start, size)
        while True:  # hand the sum up: a left half waits for its right one, a right one completes its parent
            if top == 0:
                return total
            top -= 1
            parent_start, parent_size = stack[0, top], stack[1, top]
            if parent_size > 0:
                half = int(parent_size) // 2
                half -= half % 8
                stack[2, top] = total
                stack[1, top] = -parent_size
                top += 1
                stack[0, top], stack[1, top] = parent_start + half, parent_size - half
                break
            total = stack[2, top] + total


@part_kernel
def _voxel_matrix_part(theta_array, s_in, s_out, shift, matrix_array, part):
    """Each batch item's voxel matrix: its 12 entries from theta's (N, 3, 4), any float dtype and strides, taken
    in float64, into ``matrix`` (N * 12)."""
    theta, matrix = borrowed(theta_array), borrowed(matrix_array)
    entries = np.empty(12)
    for n in range(theta.shape[0]):
        for i in range(3):
            for j in range(4):
                entries[4 * i + j] = theta[n, i, j]
        _voxel_entries(entries, s_in, s_out, shift, matrix[12 * n : 12 * n + 12])


@part_kernel
def _theta_gradient_part(moments_array, batch, depth, height, s_in, s_out, shift, scratch, dtheta_array, part):
    """Each batch item's dtheta (N, 3, 4) from the row moments (N * Do * Ho, 6): ``G``'s 12 sums over the rows
    (:func:`.affine.matrix_gradient`), each term laid out in ``scratch``'s first row and summed pairwise, then
    :func:`.affine.theta_gradient_entries`."""
    moments, dtheta = borrowed(moments_array), borrowed(dtheta_array)
    rows = depth * height
    terms, sums, stack = scratch[0], scratch[1, :12], scratch[2:5, :_DEPTH]
    entries = scratch[5, :12]
    for n in range(batch):
        for i in range(3):
            for j in range(4):
                for row in range(rows):
                    at = 6 * (n * rows + row)
                    if j == 0:
                        terms[row] = moments[at + 3 + i]
                    elif j == 1:
                        terms[row] = moments[at + i] * float(row % height)
                    elif j == 2:
                        terms[row] = moments[at + i] * float(row // height)
                    else:
                        terms[row] = moments[at + i]
                sums[4 * i + j] = 0.0 + pairwise_sum(terms, rows, stack)
        _theta_gradient_entries(sums, s_in, s_out, shift, entries)
        for i in range(3):
            for j in range(4):
                dtheta[n, i, j] = entries[4 * i + j]


def voxel_matrix(theta: np.ndarray, axes: tuple) -> np.ndarray:
    """:func:`.affine.voxel_matrix` of ``theta`` (N, 3, 4; float32 or float64), with :func:`.affine.axes`' constants,
    flat (N * 12) float64."""
    matrix = np.empty(12 * theta.shape[0])
    _voxel_matrix_part(theta, *axes, matrix, 0)
    return matrix


def theta_gradient(moments: np.ndarray, batch: int, out_sizes, axes: tuple) -> np.ndarray:
    """:func:`.affine.theta_gradient` of :func:`.affine.matrix_gradient` of the kernels' row moments
    (N * Do * Ho * 6), with :func:`.affine.axes`' constants: (N, 3, 4) float64, with the same bits."""
    rows = out_sizes[0] * out_sizes[1]
    scratch = np.empty((6, max(rows, _DEPTH)))  # a row of terms, G's sums, the pairwise sum's stack, dtheta's entries
    dtheta = np.empty((batch, 3, 4))
    _theta_gradient_part(moments, batch, out_sizes[0], out_sizes[1], *axes, scratch, dtheta, 0)
    return dtheta
