"""The precision rule (docs/semantics.md), shared by the tests, ``check`` and the benchmarks.

Golden: PyTorch's CPU ``aten::grid_sampler_3d{,_backward}`` in float64 on the upcast
inputs. Competitor: the same op in the output dtype (for float16/bfloat16: in float32 on
the upcast inputs, rounded back). PyTorch has no 3-D bicubic: there the golden is the
float64 reference (itself checked against PyTorch's 2-D bicubic) and the competitor the
differentiable torch composite run in the compute dtype. Per output we measure, over the entries that are
finite in the golden rounded to the output dtype,

    relative error  e_i = |out_i - golden_i| / max(|golden_i|, floor)
    MARE = max e_i,  MERE = mean e_i,  RMSE = sqrt(mean (out_i - golden_i)^2)

and require non-finite entries to sit exactly where the rounded golden's are. Ours passes
when each metric is at most (2, 1.2, 1.2) times max(competitor's metric, floor), with the
per-dtype small-value floor (float16 2^-11, bfloat16 2^-8, float32 2^-14, float64 2^-30).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from . import composite, reference
from .layout import from_ncdhw, to_ncdhw
from .modes import Interpolation, parse_data_format, parse_interpolation, parse_padding
from .rounding import HALF_DTYPES, round_once
from .sampling import Field, Sampling

__all__ = [
    "FLOORS",
    "RATIOS",
    "Metrics",
    "Report",
    "error_metrics",
    "compare",
    "golden_forward",
    "golden_backward",
    "competitor_forward",
    "competitor_backward",
]

FLOORS = {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8, torch.float32: 2.0**-14, torch.float64: 2.0**-30}
"""Small-value floor per dtype: a relative error is ``|out - golden| / max(|golden|, floor)``."""
RATIOS = (2.0, 1.2, 1.2)
"""The most ours may be of the competitor's (MARE, MERE, RMSE) to pass."""


@dataclass(frozen=True)
class Metrics:
    """Error of one output against the float64 golden."""

    mare: float
    mere: float
    rmse: float
    max_abs: float
    nonfinite_mismatches: int

    def __str__(self) -> str:
        return (
            f"MARE {self.mare:.3g} MERE {self.mere:.3g} RMSE {self.rmse:.3g} max|err| {self.max_abs:.3g}"
            f"{f' non-finite mismatches {self.nonfinite_mismatches}' if self.nonfinite_mismatches else ''}"
        )


@dataclass(frozen=True)
class Report:
    """Ours against the competitor for one output; ``passed`` applies the rule."""

    label: str
    ours: Metrics
    competitor: Metrics
    floor: float

    @property
    def ratios(self) -> tuple[float, float, float]:
        """ours / max(competitor, floor) per metric (pass: at most RATIOS)."""
        pairs = zip(
            (self.ours.mare, self.ours.mere, self.ours.rmse),
            (self.competitor.mare, self.competitor.mere, self.competitor.rmse),
        )
        return tuple(ours / max(theirs, self.floor) for ours, theirs in pairs)

    @property
    def limits(self) -> tuple[float, float, float]:
        """The largest MARE, MERE and RMSE that pass: RATIOS times max(competitor's metric, floor)."""
        competitor = (self.competitor.mare, self.competitor.mere, self.competitor.rmse)
        return tuple(ratio * max(theirs, self.floor) for ratio, theirs in zip(RATIOS, competitor))

    @property
    def within(self) -> tuple[bool, bool, bool]:
        """Whether MARE, MERE and RMSE each pass (ratio at most RATIOS); non-finite placement aside."""
        return tuple(r <= limit for r, limit in zip(self.ratios, RATIOS))

    @property
    def passed(self) -> bool:
        return self.ours.nonfinite_mismatches == 0 and all(self.within)

    def __str__(self) -> str:
        ratios = " ".join(f"{r:.3g}" for r in self.ratios)
        return (
            f"{self.label}: {'PASS' if self.passed else 'FAIL'} ratios (MARE, MERE, RMSE) {ratios}\n"
            f"  ours:       {self.ours}\n  competitor: {self.competitor}"
        )


def error_metrics(output: torch.Tensor, golden: torch.Tensor, dtype: torch.dtype) -> Metrics:
    """Metrics of ``output`` against the float64 ``golden`` (same shape) for ``dtype``."""
    output = torch.as_tensor(output).detach().to("cpu", torch.float64)
    golden = golden.detach().to("cpu", torch.float64)
    if output.shape != golden.shape:
        raise ValueError(f"output shape {tuple(output.shape)} differs from golden {tuple(golden.shape)}")
    rounded = round_once(golden, dtype).to(torch.float64)
    finite = torch.isfinite(rounded)
    # Outside `finite` the output must be the same NaN or the same infinity; inside it, finite.
    same_nonfinite = (output == rounded) | (torch.isnan(output) & torch.isnan(rounded))
    mismatches = int((~finite & ~same_nonfinite).sum()) + int((finite & ~torch.isfinite(output)).sum())
    both_finite = finite & torch.isfinite(output)
    if not bool(both_finite.any()):
        return Metrics(0.0, 0.0, 0.0, 0.0, mismatches)
    error = (output[both_finite] - golden[both_finite]).abs()
    relative = error / golden[both_finite].abs().clamp_min(FLOORS[dtype])
    return Metrics(
        float(relative.max()),
        float(relative.mean()),
        math.sqrt(float((error**2).mean())),
        float(error.max()),
        mismatches,
    )


def compare(label: str, output, golden: torch.Tensor, competitor, dtype: torch.dtype) -> Report:
    """Apply the rule to one output; ``output`` and ``competitor`` are in ``dtype``."""
    return Report(label, error_metrics(output, golden, dtype), error_metrics(competitor, golden, dtype), FLOORS[dtype])


def _aten_codes(interpolation_mode, padding_mode):
    return int(parse_interpolation(interpolation_mode)), int(parse_padding(padding_mode))


def _ncdhw(tensor, data_format) -> torch.Tensor:
    """A CPU tensor's logical NCDHW view of an operand (tensor or array) given in ``data_format``."""
    return to_ncdhw(torch.as_tensor(tensor).detach().cpu(), parse_data_format(data_format))


def _back(tensor, data_format):
    return None if tensor is None else from_ncdhw(tensor, parse_data_format(data_format))


def _is_bicubic(interpolation_mode) -> bool:
    return parse_interpolation(interpolation_mode) == Interpolation.BICUBIC


def _bicubic_forward(dtype, x, grid, padding_mode, align_corners):
    """PyTorch has no 3-D bicubic: float64 is the reference, other dtypes the torch composite in that dtype."""
    padding = parse_padding(padding_mode)
    if dtype == torch.float64:
        return torch.from_numpy(
            reference.grid_sampler3d_fwd(x.numpy(), grid.numpy(), Interpolation.BICUBIC, padding, bool(align_corners))
        )
    return composite.sample(x, Field.grid(grid), Sampling(Interpolation.BICUBIC, padding, bool(align_corners)))


def _bicubic_backward(dtype, grad, x, grid, padding_mode, align_corners, output_mask):
    padding = parse_padding(padding_mode)
    if dtype == torch.float64:
        dx, dgrid = reference.grid_sampler3d_bwd(
            grad.numpy(), x.numpy(), grid.numpy(), Interpolation.BICUBIC, padding, bool(align_corners), (True, True)
        )
        return torch.from_numpy(dx), torch.from_numpy(dgrid)
    x, grid = x.clone().requires_grad_(True), grid.clone().requires_grad_(True)
    with torch.enable_grad():
        y = composite.sample(x, Field.grid(grid), Sampling(Interpolation.BICUBIC, padding, bool(align_corners)))
        return torch.autograd.grad(y, (x, grid), grad)


def _forward_in(dtype, input, grid, interpolation_mode, padding_mode, align_corners, data_format):
    codes = _aten_codes(interpolation_mode, padding_mode)
    x = _ncdhw(input, data_format).to(dtype)
    if _is_bicubic(interpolation_mode):
        return _back(
            _bicubic_forward(dtype, x, torch.as_tensor(grid).detach().cpu().to(dtype), padding_mode, align_corners),
            data_format,
        )
    y = torch.ops.aten.grid_sampler_3d(x, torch.as_tensor(grid).detach().cpu().to(dtype), *codes, bool(align_corners))
    return _back(y, data_format)


def _backward_in(dtype, grad, input, grid, interpolation_mode, padding_mode, align_corners, output_mask, data_format):
    codes = _aten_codes(interpolation_mode, padding_mode)
    grad = _ncdhw(grad, data_format).to(dtype)
    x = _ncdhw(input, data_format).to(dtype)
    grid = torch.as_tensor(grid).detach().cpu().to(dtype)
    if grad.numel() == 0 or x.numel() == 0:
        dx, dgrid = torch.zeros_like(x), torch.zeros_like(grid)
    elif _is_bicubic(interpolation_mode):
        dx, dgrid = _bicubic_backward(dtype, grad, x, grid, padding_mode, align_corners, output_mask)
    else:
        dx, dgrid = torch.ops.aten.grid_sampler_3d_backward(
            grad, x, grid, *codes, bool(align_corners), list(output_mask)
        )
    dx = _back(dx, data_format) if output_mask[0] else None
    return dx, (dgrid if output_mask[1] else None)


def golden_forward(
    input, grid, interpolation_mode="bilinear", padding_mode="zeros", align_corners=False, data_format="NCDHW"
) -> torch.Tensor:
    """PyTorch CPU float64 forward on the upcast inputs (the golden), in ``data_format``."""
    return _forward_in(torch.float64, input, grid, interpolation_mode, padding_mode, align_corners, data_format)


def golden_backward(
    grad,
    input,
    grid,
    interpolation_mode="bilinear",
    padding_mode="zeros",
    align_corners=False,
    output_mask=(True, True),
    data_format="NCDHW",
):
    """PyTorch CPU float64 backward on the upcast inputs: ``(dx, dgrid)``, in ``data_format``."""
    return _backward_in(
        torch.float64, grad, input, grid, interpolation_mode, padding_mode, align_corners, output_mask, data_format
    )


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in HALF_DTYPES else dtype


def competitor_forward(
    input, grid, interpolation_mode="bilinear", padding_mode="zeros", align_corners=False, data_format="NCDHW"
) -> torch.Tensor:
    """PyTorch CPU in the inputs' dtype (half types: float32 on upcast inputs, rounded back)."""
    dtype = torch.as_tensor(input).dtype
    y = _forward_in(_compute_dtype(dtype), input, grid, interpolation_mode, padding_mode, align_corners, data_format)
    return y.to(dtype)


def competitor_backward(
    grad,
    input,
    grid,
    interpolation_mode="bilinear",
    padding_mode="zeros",
    align_corners=False,
    output_mask=(True, True),
    data_format="NCDHW",
):
    """PyTorch CPU backward in the inputs' dtype (half types: float32, rounded back)."""
    dtype = torch.as_tensor(input).dtype
    dx, dgrid = _backward_in(
        _compute_dtype(dtype),
        grad,
        input,
        grid,
        interpolation_mode,
        padding_mode,
        align_corners,
        output_mask,
        data_format,
    )
    return (None if dx is None else dx.to(dtype)), (None if dgrid is None else dgrid.to(dtype))
