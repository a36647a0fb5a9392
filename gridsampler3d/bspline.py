"""Cubic B-spline fields: the basis, the control grid, and the tables and contractions every engine reads.

A B-spline field displaces each output voxel ``p = (d, h, w)`` by a smooth field given on a
coarse grid of control points ``C`` (N, 3, Kd, Kh, Kw), components (dz, dy, dx) in input
voxels (the order and units of ``gs.warp``'s displacement):

    u(p) = sum over a, b, c of beta(t_d - a) beta(t_h - b) beta(t_w - c) C[:, a, b, c]
    t = (p - origin) / spacing                                  per axis (d, h, w)

``beta`` is the uniform cubic B-spline, ``(4 - 6 t^2 + 3 |t|^3) / 6`` for ``|t| < 1``,
``(2 - |t|)^3 / 6`` for ``1 <= |t| < 2``, 0 beyond. The sum runs over the support of the
point along each axis, the four indices ``floor(t) - 1 .. floor(t) + 2`` that lie in the
grid (``0 .. K - 1``); indices outside the grid contribute nothing. ``spacing`` and
``origin`` are in output voxels; by default the grid spans the output with one control
point beyond each end (:func:`default_grid`), as ITK's ``BSplineTransformInitializer``
lays it out.

The field is separable: every engine evaluates it in one order, along d, then h, then w,
and its gradient with respect to ``C`` in the reverse one:

    V[n, k, d, h, c] = sum_b beta_h(b) sum_a beta_d(a) C[n, k, a, b, c]      (:func:`row_coefficients`)
    u[n, k, d, h, w] = sum_c beta_w(c) V[n, k, d, h, c]                      (per point, in the kernels)
    R[n, k, d, h, c] = sum_w beta_w(c) g[n, k, d, h, w]                      (per row, in the kernels)
    dC = sum_d beta_d(a) sum_h beta_h(b) R                                   (:func:`control_gradient`)

(the CPU engine sums each output plane along h and w in its kernels, its trilinear backward
along h first, and hands the plane sums to :func:`plane_control_gradient`'s sum along d;
:mod:`gridsampler3d.cpu.spline`).

``g`` is the gradient of the loss with respect to the sampled position (in (dz, dy, dx)).
Each sum runs over the support in a fixed order (``m = 0 .. 3`` forward; for the
transposed sums, the rows in increasing order), so that the results have the same bits
for any thread count. The per-axis tables (:class:`AxisTable`) are the one place where
``t``, its support and its weights are computed; the reference, the composite and the
engines all read them. A table takes NumPy arrays or torch tensors alike.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np
import torch

__all__ = [
    "MIN_CONTROL_POINTS",
    "AxisTable",
    "axis_table",
    "beta",
    "contract",
    "control_gradient",
    "plane_control_gradient",
    "deepali_control_points",
    "deepali_grid",
    "default_grid",
    "dense_displacement",
    "grid_of",
    "row_coefficients",
    "simpleitk_control_points",
    "simpleitk_grid",
    "tables",
]

#: The fewest control points a cubic B-spline grid may have along an axis.
MIN_CONTROL_POINTS = 4


def beta(t):
    """The uniform cubic B-spline at ``t`` (a float, a NumPy array or a tensor), as the module's docstring writes it."""
    magnitude = abs(t)
    near = (4.0 - 6.0 * magnitude * magnitude + 3.0 * magnitude * magnitude * magnitude) / 6.0
    far = (2.0 - magnitude) * (2.0 - magnitude) * (2.0 - magnitude) / 6.0
    if isinstance(t, float):
        return near if magnitude < 1.0 else (far if magnitude < 2.0 else 0.0)
    where = torch.where if isinstance(t, torch.Tensor) else np.where
    return where(magnitude < 1.0, near, where(magnitude < 2.0, far, 0.0 * magnitude))


def default_grid(size: int, count: int) -> tuple[float, float]:
    """(spacing, origin) of ``count`` control points spanning ``size`` voxels with one point beyond each end: voxel 0
    at control coordinate 1, voxel ``size - 1`` at ``count - 2`` (spacing 1 where ``size`` is 1)."""
    spacing = (size - 1) / (count - 3) if size > 1 else 1.0
    return spacing, -spacing


def grid_of(out_sizes, control_sizes, spacing=None, origin=None) -> tuple[float, ...]:
    """The field's parameters, (spacing_d, spacing_h, spacing_w, origin_d, origin_h, origin_w) as floats, from
    ``spacing`` and ``origin`` (each None, one number, or one per axis (d, h, w); checked by :mod:`.validate`),
    the defaults of :func:`default_grid` where None."""
    defaults = [default_grid(size, count) for size, count in zip(out_sizes, control_sizes)]
    spacings = [d[0] for d in defaults] if spacing is None else _per_axis(spacing)
    if origin is None:
        origins = [-s for s in spacings] if spacing is not None else [d[1] for d in defaults]
    else:
        origins = _per_axis(origin)
    return tuple(float(value) for value in (*spacings, *origins))


def _per_axis(value) -> list[float]:
    if isinstance(value, (list, tuple)):
        return [float(entry) for entry in value]
    return [float(value)] * 3


class AxisTable(NamedTuple):
    """The support of each output voxel along one axis: ``index`` (S, 4) the control indices
    ``floor(t) - 1 + m`` (clamped into the grid, so that every read is valid), ``weight`` (S, 4) float64
    ``beta(t - index)``, ``valid`` (S, 4) whether the index lies in the grid (a term outside it is left out, not
    multiplied by 0: a control point that is not finite reaches no voxel outside its support)."""

    index: np.ndarray
    weight: np.ndarray
    valid: np.ndarray


@functools.lru_cache(maxsize=256)
def axis_table(size: int, count: int, spacing: float, origin: float) -> AxisTable:
    """The :class:`AxisTable` of ``size`` output voxels on ``count`` control points at ``spacing`` from ``origin``."""
    t = (np.arange(size, dtype=np.float64) - origin) / spacing
    first = np.floor(t) - 1.0
    steps = np.arange(4, dtype=np.float64)
    index = first[:, None] + steps  # exact: integers far below 2^53
    weight = beta(t[:, None] - index)
    valid = (index >= 0) & (index < count)
    clamped = np.clip(index, 0, count - 1).astype(np.int64)
    for array in (clamped, weight, valid):
        array.setflags(write=False)
    return AxisTable(clamped, weight, valid)


class TransposedTable(NamedTuple):
    """For each control index along an axis, the output voxels whose support holds it, in increasing order:
    ``rows`` (K, L) (padded with 0), ``weight`` (K, L) float64, ``valid`` (K, L)."""

    rows: np.ndarray
    weight: np.ndarray
    valid: np.ndarray


@functools.lru_cache(maxsize=256)
def transposed_table(size: int, count: int, spacing: float, origin: float) -> TransposedTable:
    """The :class:`TransposedTable` of :func:`axis_table`'s: what the gradient's sums over output voxels read."""
    table = axis_table(size, count, spacing, origin)
    rows, steps = np.nonzero(table.valid)  # in increasing row order, then m
    controls = table.index[rows, steps]
    order = np.argsort(controls, kind="stable")  # by control index, rows still increasing
    rows, steps, controls = rows[order], steps[order], controls[order]
    counts = np.bincount(controls, minlength=count)
    width = max(int(counts.max()) if counts.size else 0, 1)
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    slot = np.arange(rows.size) - np.repeat(starts, counts)
    padded_rows = np.zeros((count, width), np.int64)
    weight = np.zeros((count, width))
    valid = np.zeros((count, width), bool)
    padded_rows[controls, slot] = rows
    weight[controls, slot] = table.weight[rows, steps]
    valid[controls, slot] = True
    for array in (padded_rows, weight, valid):
        array.setflags(write=False)
    return TransposedTable(padded_rows, weight, valid)


def tables(out_sizes, control_sizes, parameters) -> tuple[AxisTable, AxisTable, AxisTable]:
    """The :class:`AxisTable` of each axis (d, h, w) of a field of ``parameters`` (:func:`grid_of`)."""
    spacing, origin = parameters[:3], parameters[3:]
    return tuple(
        axis_table(int(size), int(count), s, o) for size, count, s, o in zip(out_sizes, control_sizes, spacing, origin)
    )


def contract(values, dim: int, index, weight, valid):
    """sum over m of ``weight[:, m] * values[..., index[:, m], ...]`` along ``dim``, terms with ``valid`` False left
    out, m in order: an (S, 4) table's contraction of ``values`` (a tensor or an array; the result has S along
    ``dim``)."""
    is_tensor = isinstance(values, torch.Tensor)
    total = None
    shape = [1] * values.ndim
    shape[dim] = -1
    for m in range(index.shape[1]):
        if is_tensor:
            picked = values.index_select(dim, torch.tensor(index[:, m], device=values.device))
            w = torch.tensor(weight[:, m], dtype=values.dtype, device=values.device).reshape(shape)
            ok = torch.tensor(valid[:, m], device=values.device).reshape(shape)
            term = torch.where(ok, picked * w, torch.zeros((), dtype=values.dtype, device=values.device))
        else:
            picked = np.take(values, index[:, m], axis=dim)
            with np.errstate(invalid="ignore", over="ignore"):
                term = np.where(valid[:, m].reshape(shape), picked * weight[:, m].reshape(shape), 0.0)
        total = term if total is None else total + term
    return total


def row_coefficients(control_points, out_sizes, parameters):
    """V (N, 3, Do, Ho, Kw): the field's coefficients per output row, ``sum_b beta_h(b) sum_a beta_d(a) C[..., a,
    b, :]``, from ``control_points`` (N, 3, Kd, Kh, Kw), a tensor (differentiable) or an array, in its dtype."""
    depth, height, _ = tables(out_sizes, control_points.shape[2:], parameters)[:3]
    along_d = contract(control_points, 2, *depth)
    return contract(along_d, 3, *height)


def dense_displacement(control_points, out_sizes, parameters):
    """u (N, 3, Do, Ho, Wo), (dz, dy, dx) in voxels: the dense field, the explicit path (differentiable for a
    tensor). The engines never make it; the reference, the composite, ONNX export and a theta that is not finite
    do."""
    width = tables(out_sizes, control_points.shape[2:], parameters)[2]
    return contract(row_coefficients(control_points, out_sizes, parameters), 4, *width)


def control_gradient(row_sums, control_sizes, out_sizes, parameters):
    """dC (N, 3, Kd, Kh, Kw) from the kernels' row sums ``R`` (N, 3, Do, Ho, Kw) (``sum_w beta_w(c) g``): the sums
    over h, then over d (:func:`plane_control_gradient`), each over the rows in increasing order, in the dtype of
    ``row_sums`` (float64)."""
    spacing, origin = parameters[1], parameters[4]
    along_h = contract(row_sums, 3, *transposed_table(int(out_sizes[1]), int(control_sizes[1]), spacing, origin))
    return plane_control_gradient(along_h, control_sizes, out_sizes, parameters)


def plane_control_gradient(plane_sums, control_sizes, out_sizes, parameters):
    """dC (N, 3, Kd, Kh, Kw) from the sums ``dT`` (N, 3, Do, Kh, Kw) of each output plane's row sums along h: the sum
    over d, the planes in increasing order, in the dtype of ``plane_sums`` (float64)."""
    table = transposed_table(int(out_sizes[0]), int(control_sizes[0]), parameters[0], parameters[3])
    return contract(plane_sums, 2, *table)


def simpleitk_grid(image_size, mesh_size) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(spacing, origin) per axis (d, h, w), in voxels, of the control grid of SimpleITK's
    ``BSplineTransformInitializer(image, mesh_size)`` for an image of ``image_size`` (D, H, W) with spacing 1 and
    origin 0 (what TorchIO's ``RandomElasticDeformation`` builds, per channel).

    ``mesh_size`` is in SimpleITK's axis order (x, y, z) = (w, h, d); the grid has ``mesh + 3``
    points per axis. ITK lays the transform's domain over the image's outer corners widened by
    1/8 voxel on each side (voxels -5/8 .. S - 3/8), ``mesh`` intervals long, with one control
    point before it: spacing ``(S + 1/4) / mesh``, origin ``-5/8 - spacing``. On the image's
    voxels the field equals ITK's (``TransformToDisplacementField``; ITK gives no displacement
    outside its domain, where this formula would still sum the support).
    """
    sizes = tuple(int(size) for size in image_size)
    meshes = tuple(int(mesh) for mesh in reversed(tuple(mesh_size)))  # (z, y, x) = (d, h, w)
    spacing = tuple((size + 0.25) / mesh for size, mesh in zip(sizes, meshes))
    return spacing, tuple(-0.625 - s for s in spacing)


def simpleitk_control_points(parameters, control_sizes):
    """The control points (3, Kd, Kh, Kw), (dz, dy, dx) in voxels, of a SimpleITK B-spline transform's parameters
    (``GetParameters()``: the x, y and z components' coefficient images one after the other, each x fastest) on
    the grid of :func:`simpleitk_grid` (an image of spacing 1: physical units are voxels). ``control_sizes`` is
    (Kd, Kh, Kw); a NumPy array comes back for a sequence, a tensor for a tensor."""
    values = parameters if isinstance(parameters, torch.Tensor) else np.asarray(parameters, dtype=np.float64)
    grid = values.reshape(3, *control_sizes)
    return grid.flip(0) if isinstance(grid, torch.Tensor) else grid[::-1].copy()


def deepali_grid(image_size, stride=5) -> tuple[tuple[int, ...], tuple[float, ...], tuple[float, ...]]:
    """(control grid sizes, spacing, origin) per axis (d, h, w) of deepali's ``FreeFormDeformation(grid, stride)``
    on an image of ``image_size`` (D, H, W): a control point every ``stride`` voxels (an int, or one per axis in
    deepali's order (x, y, z); deepali's default 5) from one stride before voxel 0, ``floor((S - 1) / s) + 4``
    points per axis."""
    strides = (int(stride),) * 3 if isinstance(stride, (int, np.integer)) else tuple(int(s) for s in reversed(stride))
    counts = tuple((size - 1) // s + 4 for size, s in zip(image_size, strides))
    return counts, tuple(float(s) for s in strides), tuple(-float(s) for s in strides)


def deepali_control_points(params, image_size):
    """The control points (N, 3, Kd, Kh, Kw), (dz, dy, dx) in voxels, of a deepali free-form deformation's
    ``params`` (N, 3, Kd, Kh, Kw), components (x, y, z) in deepali's normalised units (-1 and 1 the centres of
    the first and last voxels) on an image of ``image_size`` (D, H, W). Differentiable for a tensor."""
    scale = [(size - 1) / 2 for size in image_size]  # (d, h, w)
    if isinstance(params, torch.Tensor):
        return params.flip(1) * torch.tensor(scale, dtype=params.dtype, device=params.device).reshape(1, 3, 1, 1, 1)
    return np.asarray(params)[:, ::-1] * np.reshape(scale, (1, 3, 1, 1, 1))
