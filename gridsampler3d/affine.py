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


def _stack(values, axis: int):
    return np.stack(values, axis=axis) if isinstance(values[0], np.ndarray) else torch.stack(values, dim=axis)


def _slope(size: int, align_corners: bool) -> float:
    """d index / d normalised coordinate along an axis of ``size`` voxels."""
    return (size - 1) * 0.5 if align_corners else size * 0.5


def _axes(in_sizes, out_sizes, align_corners: bool):
    """(s_in per x, y, z; s_out per w, h, d, None for an axis whose normalised coordinate is always 0; b)."""
    depth, height, width = in_sizes
    out_depth, out_height, out_width = out_sizes
    s_in = [_slope(size, align_corners) for size in (width, height, depth)]
    s_out = [
        None if (align_corners and size == 1) else _slope(size, align_corners)
        for size in (out_width, out_height, out_depth)
    ]
    return s_in, s_out, 0.0 if align_corners else 0.5


def voxel_matrix(theta, in_sizes, out_sizes, align_corners: bool):
    """``M`` (N, 3, 4), float64: input voxel positions (x, y, z) = M @ (w, h, d, 1) of output voxels.

    ``theta`` (N, 3, 4) float64 (NumPy or torch); ``in_sizes`` and ``out_sizes`` (D, H, W).
    """
    s_in, s_out, shift = _axes(in_sizes, out_sizes, align_corners)
    zero = theta[:, 0, 0] * 0.0
    rows = []
    for i in range(3):
        columns = [zero if s_out[j] is None else (s_in[i] * theta[:, i, j]) / s_out[j] for j in range(3)]
        inner = theta[:, i, 3] + 1.0
        shifted = zero
        for j in range(3):
            if s_out[j] is not None:
                inner = inner - theta[:, i, j]
                shifted = shifted + columns[j] * shift
        rows.append(_stack([*columns, (shifted + s_in[i] * inner) - shift], 1))
    return _stack(rows, 1)


def theta_from_voxel_matrix(matrix, in_sizes, out_sizes, align_corners: bool):
    """The theta (N, 3, 4), float64, whose :func:`voxel_matrix` is ``matrix`` (N, 3, 4): an affine map from output
    voxels (w, h, d) to input voxel positions (x, y, z), as ``F.affine_grid`` takes it.

    A column of an output axis whose normalised coordinate is always 0 (one voxel with
    align_corners) is dropped (it multiplies 0), as is a row of an input axis that every
    position maps to index 0 (one voxel with align_corners).
    """
    s_in, s_out, shift = _axes(in_sizes, out_sizes, align_corners)
    zero = matrix[:, 0, 0] * 0.0
    rows = []
    for i in range(3):
        if s_in[i] == 0.0:
            rows.append(_stack([zero] * 4, 1))
            continue
        columns = [zero if s_out[j] is None else matrix[:, i, j] * s_out[j] / s_in[i] for j in range(3)]
        offset = matrix[:, i, 3] + shift
        for j in range(3):
            if s_out[j] is not None:
                offset = offset - matrix[:, i, j] * shift
        offset = offset / s_in[i] - 1.0
        for j in range(3):
            offset = offset + columns[j]
        rows.append(_stack([*columns, offset], 1))
    return _stack(rows, 1)


def matrix_gradient(row_moments, batch: int, out_sizes):
    """``G`` (N, 3, 4), float64, from per-row moments (N * Do * Ho, 6), rows numbered n * Do * Ho + d * Ho + h.

    A row's moments are ``sum_w g_i`` and ``sum_w g_i * w`` (i = x, y, z), ``g`` the gradient
    with respect to the point's position; ``G[i, j]`` sums ``g_i * (w, h, d, 1)[j]`` over all
    points. Sums over the rows in a fixed order (NumPy's, or torch's on one device).
    """
    out_depth, out_height, _ = out_sizes
    moments = row_moments.reshape(batch, out_depth, out_height, 6)
    h = _range(out_height, moments).reshape(1, 1, out_height)
    d = _range(out_depth, moments).reshape(1, out_depth, 1)
    rows = []
    for i in range(3):
        sums, weighted = moments[..., i], moments[..., 3 + i]
        rows.append(
            _stack(
                [
                    weighted.sum(axis=(1, 2)),
                    (sums * h).sum(axis=(1, 2)),
                    (sums * d).sum(axis=(1, 2)),
                    sums.sum(axis=(1, 2)),
                ],
                1,
            )
        )
    return _stack(rows, 1)


def _range(count: int, like):
    """0.0, 1.0, ..., count - 1 in float64, as an array of ``like``'s kind (and device)."""
    if isinstance(like, np.ndarray):
        return np.arange(count, dtype=np.float64)
    return torch.arange(count, dtype=torch.float64, device=like.device)


def theta_gradient(matrix_grad, in_sizes, out_sizes, align_corners: bool):
    """dL/dtheta (N, 3, 4), float64, from ``G`` (:func:`matrix_gradient`)."""
    s_in, s_out, shift = _axes(in_sizes, out_sizes, align_corners)
    zero = matrix_grad[:, 0, 0] * 0.0
    rows = []
    for i in range(3):
        constant = matrix_grad[:, i, 3]
        columns = [
            zero
            if s_out[j] is None
            else (s_in[i] / s_out[j]) * matrix_grad[:, i, j] + (s_in[i] * (shift / s_out[j] - 1.0)) * constant
            for j in range(3)
        ]
        rows.append(_stack([*columns, s_in[i] * constant], 1))
    return _stack(rows, 1)


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
