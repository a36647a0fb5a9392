"""What both engines plan on: the stage, the description of a call, and which gradients a backward makes how.

    problem = Problem.describe(Stage.BACKWARD, x, field, sampling, outputs)   # from the call's records
    passes(problem)   # Passes(dx=True, field=Gradient.COMPUTED, theta=Gradient.NONE)

Each engine's planner extends :class:`Problem` with what it alone reads (the CPU engine's
threads and layout facts, :class:`.cpu.planner.Call`; the GPU's compute capability and
determinism, :class:`.gpu.planner.GpuCall`) and builds its plan from it; both read
:func:`passes` for what a backward makes, so that a nearest sampling's zero field
gradient, or a theta asked for of a field without one, is decided here once.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from typing import NamedTuple

from .dtypes import dtype_name
from .modes import Interpolation
from .sampling import FieldKind, Outputs, Sampling

__all__ = ["Gradient", "Passes", "Problem", "Stage", "passes"]


class Stage(str, enum.Enum):
    """The pass a call runs: the forward (y) or the backward (dx and the field's gradients)."""

    FORWARD = "forward"
    BACKWARD = "backward"


class Gradient(enum.Enum):
    """How a backward makes the gradient of the field's tensor, or of theta."""

    NONE = "none"  # not asked for (or the field has no such tensor)
    ZEROS = "zeros"  # nearest: zero everywhere (the sampled value is piecewise constant), no pass
    COMPUTED = "computed"  # from the gradient with respect to each point's position


class Passes(NamedTuple):
    """What a call makes: dx or not, and how the field tensor's and theta's gradients are made."""

    dx: bool = False
    field: Gradient = Gradient.NONE
    theta: Gradient = Gradient.NONE

    @property
    def positions(self) -> Gradient:
        """The gradient with respect to each point's position, which both field gradients are made from: computed
        where either is, zero where either is zero, else none."""
        kinds = (self.field, self.theta)
        if Gradient.COMPUTED in kinds:
            return Gradient.COMPUTED
        return Gradient.ZEROS if Gradient.ZEROS in kinds else Gradient.NONE


@dataclasses.dataclass(frozen=True)
class Problem:
    """A call as both planners see it. Sizes are (D, H, W) of the input and (Do, Ho, Wo) of the output.

    ``dtype`` is the operands' (by name, :func:`.dtypes.dtype_name`), ``sampling`` and
    ``field`` the call's rule and kind of field (:mod:`gridsampler3d.sampling`),
    ``outputs`` the gradients a backward is asked for.
    """

    stage: Stage
    batch: int
    channels: int
    sizes: tuple
    out_sizes: tuple
    dtype: str = "float32"
    sampling: Sampling = Sampling()
    field: FieldKind = FieldKind.GRID
    outputs: Outputs = Outputs()

    @property
    def points(self) -> int:
        """N * Do * Ho * Wo."""
        return self.batch * math.prod(self.out_sizes)

    @property
    def passes(self) -> Passes:
        """:func:`passes` of this problem."""
        return passes(self)

    @classmethod
    def describe(cls, stage: Stage, x, field, sampling: Sampling, outputs: Outputs = Outputs(), **facts):
        """The description of a call on ``x`` (N, C, D, H, W, any device, meta included) and ``field``
        (:class:`.sampling.Field`), with the engine's own ``facts`` (the fields a subclass adds)."""
        return cls(
            stage=stage,
            batch=x.shape[0],
            channels=x.shape[1],
            sizes=tuple(x.shape[2:]),
            out_sizes=tuple(field.out_sizes),
            dtype=dtype_name(x.dtype),
            sampling=sampling,
            field=field.kind,
            outputs=Outputs(*map(bool, outputs)),
            **facts,
        )


def passes(problem: Problem) -> Passes:
    """What ``problem`` makes: nothing but y in a forward; in a backward, dx where asked, and each field gradient
    asked for that the field has: zero for nearest, computed otherwise."""
    if problem.stage == Stage.FORWARD:
        return Passes()
    made = Gradient.ZEROS if problem.sampling.interpolation == Interpolation.NEAREST else Gradient.COMPUTED
    outputs, kind = problem.outputs, problem.field
    has_tensor = kind != FieldKind.AFFINE
    return Passes(
        dx=outputs.dx,
        field=made if outputs.dfield and has_tensor else Gradient.NONE,
        theta=made if outputs.dtheta and kind.affine else Gradient.NONE,
    )
