"""The affine field in voxel terms: theta as ``F.affine_grid`` takes it, turned into the matrix the kernels use.

``F.affine_grid(theta, size, align_corners)`` gives output voxel (w, h, d) the normalised
coordinate ``theta @ (u_x, u_y, u_z, 1)``, where ``u`` normalises the output voxel and
``F.grid_sample`` then unnormalises the result into the input's voxels. Both maps are
affine along each axis, so the whole is one matrix ``M`` (N, 3, 4) from output voxels to
input voxel positions (x, y, z):

    position_i = M[i, 0] w + ((M[i, 1] h + M[i, 2] d) + M[i, 3])          i = x, y, z

(each engine evaluates it in this order). With ``s`` the unnormalising slope of an axis
(``S / 2``, or ``(S - 1) / 2`` with align_corners) and ``b`` its half-voxel shift (0.5,
or 0 with align_corners):

    M[i, j] = (s_in_i theta[i, j]) / s_out_j
    M[i, 3] = (sum_j M[i, j] b + s_in_i ((theta[i, 3] + 1) - sum_j theta[i, j])) - b

An output axis of one voxel with align_corners has ``u = 0`` (``F.affine_grid``'s rule),
so its column of ``M``, and its terms above, are zero. The identity theta with equal sizes
gives ``M = [I | 0]`` exactly, so an affine field with a displacement is then ``gs.warp``
bit for bit. ``M`` equals the composition of ``F.affine_grid`` and the unnormalisation up
to float64 rounding (docs/semantics.md, "The affine field").

The gradient with respect to theta follows from the sums ``G[i, j]`` of ``dL/d position_i``
times ``(w, h, d, 1)[j]`` over the points (:func:`matrix_gradient`), in float64:

    dtheta[i, j] = (s_in_i / s_out_j) G[i, j] + s_in_i (b / s_out_j - 1) G[i, 3]
    dtheta[i, 3] = s_in_i G[i, 3]

Every function here takes NumPy arrays or torch tensors alike (float64), so that the
reference and the engines compute the same bits.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = [
    "explicit_grid",
    "explicit_grid_steps",
    "matrix_gradient",
    "theta_from_voxel_matrix",
    "theta_gradient",
    "voxel_matrix",
]


def _per_matrix(entries_of, values, *constants):
    """``entries_of(entries, *constants, out)`` for the (3, 4) matrices of ``values`` (N, 3, 4), as an (N, 3, 4)
    float64 array of ``values``' kind.

    ``entries_of`` reads the matrix's 12 entries in row-major order (``entries[4 * i + j]``,
    each the (N,) entries of the batch) and writes the result's 12 into ``out``: elementwise
    operations, so that NumPy arrays, torch tensors, Python floats and the CPU engine's
    compiled copy of the same function (``cpu/theta.py``) give the same bits. Torch's
    results are stacked, which keeps them differentiable.
    """
    if isinstance(values, np.ndarray):
        out = np.empty((12, values.shape[0]))
        entries_of(values.reshape(-1, 12).T, *constants, out)
        return out.T.reshape(-1, 3, 4)
    out = [None] * 12
    entries_of(values.reshape(-1, 12).T, *constants, out)
    return torch.stack(out, dim=1).reshape(-1, 3, 4)


def _slope(size: int, align_corners: bool) -> float:
    """d index / d normalised coordinate along an axis of ``size`` voxels."""
    return (size - 1) * 0.5 if align_corners else size * 0.5


def axes(in_sizes, out_sizes, align_corners: bool) -> tuple:
    """(s_in per x, y, z; s_out per w, h, d, 0.0 for an axis whose normalised coordinate is always 0; b): the
    slopes of :func:`_slope` as tuples of floats, kept by sizes (the constants of the entry-wise functions)."""
    key = (*in_sizes, *out_sizes, align_corners)
    try:
        return _AXES[key]
    except KeyError:
        if len(_AXES) >= 256:
            _AXES.clear()
        slopes = _AXES[key] = _slopes(in_sizes, out_sizes, align_corners)
        return slopes
    except TypeError:  # symbolic sizes (torch.export): not kept
        return _slopes(in_sizes, out_sizes, align_corners)


_AXES: dict = {}


def _slopes(in_sizes, out_sizes, align_corners: bool) -> tuple:
    depth, height, width = in_sizes
    out_depth, out_height, out_width = out_sizes
    if align_corners:  # an output axis of one voxel: its normalised coordinate is 0 (s_out 0.0 marks it)
        s_in = ((width - 1) * 0.5, (height - 1) * 0.5, (depth - 1) * 0.5)
        s_out = tuple(0.0 if size == 1 else (size - 1) * 0.5 for size in (out_width, out_height, out_depth))
        return s_in, s_out, 0.0
    return (width * 0.5, height * 0.5, depth * 0.5), (out_width * 0.5, out_height * 0.5, out_depth * 0.5), 0.5


def voxel_matrix(theta, in_sizes, out_sizes, align_corners: bool):
    """``M`` (N, 3, 4), float64: input voxel positions (x, y, z) = M @ (w, h, d, 1) of output voxels.

    ``theta`` (N, 3, 4) float64 (NumPy or torch); ``in_sizes`` and ``out_sizes`` (D, H, W).
    """
    return _per_matrix(voxel_entries, theta, *axes(in_sizes, out_sizes, align_corners))


def voxel_entries(theta, s_in, s_out, shift, out):
    """M's 12 entries into ``out`` from theta's 12 (row-major; see :func:`_per_matrix`), with :func:`axes`'
    constants.

    A column of an axis whose ``s_out`` is 0.0 is zero, and left out of the sums.
    """
    zero = theta[0] * 0.0
    for i in range(3):
        inner = theta[4 * i + 3] + 1.0
        shifted = zero
        for j in range(3):
            if s_out[j] == 0.0:
                out[4 * i + j] = zero
            else:
                column = (s_in[i] * theta[4 * i + j]) / s_out[j]
                out[4 * i + j] = column
                inner = inner - theta[4 * i + j]
                shifted = shifted + column * shift
        out[4 * i + 3] = (shifted + s_in[i] * inner) - shift


def theta_from_voxel_matrix(matrix, in_sizes, out_sizes, align_corners: bool):
    """The theta (N, 3, 4), float64, whose :func:`voxel_matrix` is ``matrix`` (N, 3, 4): an affine map from output
    voxels (w, h, d) to input voxel positions (x, y, z), as ``F.affine_grid`` takes it.

    A column of an output axis whose normalised coordinate is always 0 (one voxel with
    align_corners) is dropped (it multiplies 0), as is a row of an input axis that every
    position maps to index 0 (one voxel with align_corners).
    """
    return _per_matrix(_theta_entries, matrix, *axes(in_sizes, out_sizes, align_corners))


def _theta_entries(matrix, s_in, s_out, shift, out):
    zero = matrix[0] * 0.0
    for i in range(3):
        if s_in[i] == 0.0:
            for j in range(4):
                out[4 * i + j] = zero
            continue
        offset = matrix[4 * i + 3] + shift
        for j in range(3):
            if s_out[j] == 0.0:
                out[4 * i + j] = zero
            else:
                out[4 * i + j] = matrix[4 * i + j] * s_out[j] / s_in[i]
                offset = offset - matrix[4 * i + j] * shift
        offset = offset / s_in[i] - 1.0
        for j in range(3):
            offset = offset + out[4 * i + j]
        out[4 * i + 3] = offset


def matrix_gradient(row_moments, batch: int, out_sizes):
    """``G`` (N, 3, 4), float64, from per-row moments (N * Do * Ho, 6), rows numbered n * Do * Ho + d * Ho + h.

    A row's moments are ``sum_w g_i`` and ``sum_w g_i * w`` (i = x, y, z), ``g`` the gradient
    with respect to the point's position; ``G[i, j]`` sums ``g_i * (w, h, d, 1)[j]`` over all
    points. Sums over the rows in a fixed order (NumPy's, or torch's on one device).

    NumPy's twelve sums run as one reduction over the rows of the twelve terms, each term's
    rows contiguous: the same pairwise sums, in the same order, as twelve reductions of its
    own (``tests/test_affine.py`` holds the two to the same bits).
    """
    out_depth, out_height, _ = out_sizes
    moments = row_moments.reshape(batch, out_depth, out_height, 6)
    if isinstance(moments, np.ndarray):
        h, d = _row_indices(out_depth, out_height)
        terms = np.empty((batch, 12, out_depth, out_height))
        for i in range(3):
            sums = moments[..., i]
            terms[:, 4 * i] = moments[..., 3 + i]
            terms[:, 4 * i + 1] = sums * h
            terms[:, 4 * i + 2] = sums * d
            terms[:, 4 * i + 3] = sums
        return np.add.reduce(terms, axis=(2, 3)).reshape(batch, 3, 4)
    h = torch.arange(out_height, dtype=torch.float64, device=moments.device).reshape(1, 1, out_height)
    d = torch.arange(out_depth, dtype=torch.float64, device=moments.device).reshape(1, out_depth, 1)
    rows = []
    for i in range(3):
        sums, weighted = moments[..., i], moments[..., 3 + i]
        rows.append(
            [weighted.sum(axis=(1, 2)), (sums * h).sum(axis=(1, 2)), (sums * d).sum(axis=(1, 2)), sums.sum(axis=(1, 2))]
        )
    return torch.stack([torch.stack(row, dim=1) for row in rows], dim=1)


def _row_indices(out_depth: int, out_height: int) -> tuple:
    """(h (1, 1, Ho), d (1, Do, 1)): each output row's h and d, float64, kept by sizes."""
    key = (out_depth, out_height)
    try:
        return _ROW_INDICES[key]
    except KeyError:
        if len(_ROW_INDICES) >= 64:
            _ROW_INDICES.clear()
        h = np.arange(out_height, dtype=np.float64)[None, None, :]
        d = np.arange(out_depth, dtype=np.float64)[None, :, None]
        _ROW_INDICES[key] = h, d
        return h, d


_ROW_INDICES: dict = {}


def theta_gradient(matrix_grad, in_sizes, out_sizes, align_corners: bool):
    """dL/dtheta (N, 3, 4), float64, from ``G`` (:func:`matrix_gradient`)."""
    return _per_matrix(theta_gradient_entries, matrix_grad, *axes(in_sizes, out_sizes, align_corners))


def theta_gradient_entries(matrix_grad, s_in, s_out, shift, out):
    """dtheta's 12 entries into ``out`` from G's 12 (row-major; see :func:`_per_matrix`), with :func:`axes`'
    constants."""
    zero = matrix_grad[0] * 0.0
    for i in range(3):
        constant = matrix_grad[4 * i + 3]
        for j in range(3):
            if s_out[j] == 0.0:
                out[4 * i + j] = zero
            else:
                gain = s_in[i] * (shift / s_out[j] - 1.0)
                out[4 * i + j] = (s_in[i] / s_out[j]) * matrix_grad[4 * i + j] + gain * constant
        out[4 * i + 3] = s_in[i] * constant


def explicit_grid(theta: torch.Tensor, out_sizes, align_corners: bool, in_sizes=None, displacement=None):
    """The grid (N, Do, Ho, Wo, 3) a user builds for the field: ``F.affine_grid`` of theta, plus a displacement
    (N, 3, Do, Ho, Wo, in voxels of an input of ``in_sizes``) turned into normalised units; differentiable.

    It is how the field's semantics read, and what runs for a theta that is not finite.
    """
    batch = theta.shape[0]
    grid = torch.nn.functional.affine_grid(theta, (batch, 1, *out_sizes), align_corners=align_corners)
    if displacement is None:
        return grid
    return grid + explicit_grid_steps(displacement, in_sizes, align_corners)


def explicit_grid_steps(displacement: torch.Tensor, in_sizes, align_corners: bool) -> torch.Tensor:
    """A displacement (N, 3, Do, Ho, Wo), (dz, dy, dx) in voxels of an input of ``in_sizes`` (D, H, W), as grid
    steps (N, Do, Ho, Wo, 3), (x, y, z) in normalised units; differentiable."""
    slopes = [_slope(size, align_corners) for size in reversed(in_sizes)]  # x, y, z
    # A one-voxel axis with align_corners takes index 0 from any normalised coordinate: no step moves it.
    return torch.stack(
        [
            displacement[:, 2 - axis] / slopes[axis] if slopes[axis] else displacement[:, 2 - axis] * 0
            for axis in range(3)
        ],
        dim=-1,
    )
