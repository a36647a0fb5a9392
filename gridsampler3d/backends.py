"""Backend registry: which engine runs a call, the contract every engine keeps (:class:`Backend`), and the dispatch
of a checked call to it (:func:`forward`, :func:`backward`: empty calls, and the explicit path of a theta that is
not finite).

A backend receives torch tensors already validated and in logical NCDHW order (an NDHWC
operand arrives as a permuted, channels-last strided view; nothing is copied on the way),
the field as a :class:`.sampling.Field` and the rule as a :class:`.sampling.Sampling`, and
returns tensors in logical NCDHW order, laid out like its ``x``; a field's gradient comes
back shaped like the field's tensor, in :meth:`.sampling.Field.gradient_format`.
"""

from __future__ import annotations

import importlib.metadata
import warnings
from typing import Protocol

import torch

from . import reference
from .affine import explicit_grid
from .bspline import dense_displacement
from .layout import memory_format_of
from .rounding import round_once
from .sampling import Field, Gradients, Outputs, Sampling

__all__ = [
    "BACKENDS",
    "Backend",
    "available_backends",
    "select_backend",
    "describe_backends",
    "auto_choices",
    "backward",
    "forward",
    "cpu_engine",
    "library_versions",
    "ReferenceBackend",
]

# The device types a backend is asked about when it describes itself.
DEVICE_TYPES = ("cpu", "cuda")


class Backend(Protocol):
    """What every engine implements: the NumPy reference, the Numba CPU engine and the Triton GPU engine."""

    name: str

    def unavailable_reason(self) -> str | None:
        """Why the engine cannot run here (a missing package, no device), or None."""

    def supports(self, device: torch.device) -> bool:
        """Whether the engine runs tensors on ``device``."""

    def forward(self, x: torch.Tensor, field: Field, sampling: Sampling) -> torch.Tensor:
        """y (N, C, Do, Ho, Wo): ``x`` (N, C, D, H, W) sampled at ``field``, laid out like ``x``."""

    def backward(
        self,
        grad: torch.Tensor,
        x: torch.Tensor,
        field: Field,
        sampling: Sampling,
        outputs: Outputs,
        deterministic: bool,
    ) -> Gradients:
        """(dx like ``x``, the gradient of the field's tensor like it, theta's like theta), None where ``outputs``
        leaves one out.

        ``grad`` is (N, C, Do, Ho, Wo); ``deterministic`` asks for the same bits on every run
        (the CPU engines always give them), None for torch's flag
        (``torch.are_deterministic_algorithms_enabled()``).
        """


def _to_float64_numpy(tensor: torch.Tensor):
    return tensor.detach().to(device="cpu", dtype=torch.float64).numpy()


def _tensor_like(values, like: torch.Tensor, memory_format: torch.memory_format) -> torch.Tensor:
    """A float64 array rounded once into a new tensor of ``like``'s dtype and device, in ``memory_format``."""
    out = torch.empty(values.shape, dtype=like.dtype, device=like.device, memory_format=memory_format)
    return out.copy_(round_once(torch.from_numpy(values), like.dtype))


class ReferenceBackend:
    """The NumPy float64 golden: computes in float64 on the CPU, rounds once to the dtype."""

    name = "reference"

    def unavailable_reason(self) -> str | None:
        return None

    def supports(self, device: torch.device) -> bool:
        return True

    def forward(self, x: torch.Tensor, field: Field, sampling: Sampling) -> torch.Tensor:
        y = reference.sample(_to_float64_numpy(x), _reference_field(field), field.kind, sampling)
        return _tensor_like(y, x, memory_format_of(x))

    def backward(
        self,
        grad: torch.Tensor,
        x: torch.Tensor,
        field: Field,
        sampling: Sampling,
        outputs: Outputs,
        deterministic: bool,
    ) -> Gradients:
        dx, dfield, dtheta = reference.sample_backward(
            _to_float64_numpy(grad), _to_float64_numpy(x), _reference_field(field), field.kind, sampling, outputs
        )
        return Gradients(
            None if dx is None else _tensor_like(dx, x, memory_format_of(x)),
            None if dfield is None else _tensor_like(dfield, field.tensor, field.gradient_format()),
            None if dtheta is None else _tensor_like(dtheta, field.theta, torch.contiguous_format),
        )


def _reference_field(field: Field):
    """The field as :func:`.reference.positions` takes it: a float64 array, (theta, size or displacement), or a
    B-spline's (control points, size, parameters, theta or None)."""
    if field.kind.spline:
        theta = None if field.theta is None else _to_float64_numpy(field.theta)
        return _to_float64_numpy(field.tensor), field.out_sizes, field.parameters, theta
    if not field.kind.affine:
        return _to_float64_numpy(field.tensor)
    rest = field.out_sizes if field.tensor is None else _to_float64_numpy(field.tensor)
    return _to_float64_numpy(field.theta), rest


class _Missing:
    """Stands in for a backend whose module cannot be imported here; ``device_types``: what it would run on."""

    def __init__(self, name: str, error: ImportError, device_types: tuple[str, ...]):
        self.name, self._reason, self._device_types = name, f"cannot be imported: {error}", device_types

    def unavailable_reason(self) -> str | None:
        return self._reason

    def supports(self, device: torch.device) -> bool:
        return device.type in self._device_types


def _registry():
    try:
        from .cpu import NumbaBackend

        numba = NumbaBackend()
    except ImportError as error:
        numba = _Missing("numba", error, ("cpu",))
    from .gpu import TritonBackend  # imports Triton only when a kernel first runs

    return {"numba": numba, "triton": TritonBackend(), "reference": ReferenceBackend()}


BACKENDS = _registry()
# Preference order of "auto" per device type; the first available one that supports it wins.
_AUTO_ORDER = {"cpu": ("numba", "reference"), "cuda": ("triton", "reference")}


# What makes each engine available, named when "auto" has to pass it over.
_REMEDIES = {
    "numba": "pip install numba",
    "triton": "pip install 'gridsampler3d[gpu]' (Triton) next to a CUDA build of PyTorch",
}
_warned_fallbacks: set[str] = set()


def _auto_backend(device: torch.device):
    """The backend "auto" picks for ``device``, and (name, reason) of each preferred one passed over."""
    passed_over = []
    for candidate in _AUTO_ORDER.get(device.type, ("reference",)):
        backend = BACKENDS[candidate]
        reason = backend.unavailable_reason()
        if reason is None and backend.supports(device):
            return backend, passed_over
        passed_over.append((candidate, reason or f"does not run on {device.type} tensors"))
    return BACKENDS["reference"], passed_over


def _warn_slow_fallback(device: torch.device, passed_over) -> None:
    """Warn once per device type that "auto" runs it on the NumPy reference (host copies, float64)."""
    if device.type in _warned_fallbacks:
        return
    _warned_fallbacks.add(device.type)
    if passed_over:
        why = "; ".join(f"{name}: {reason}" for name, reason in passed_over)
        remedy = "; ".join(f"for {name}: {_REMEDIES[name]}" for name, _ in passed_over if name in _REMEDIES)
    else:
        why, remedy = f"no engine runs {device.type} tensors", "compute on CPU or CUDA tensors"
    warnings.warn(
        f"gridsampler3d: backend='auto' runs {device.type} tensors on the NumPy reference, which copies "
        f"them to the host and back and is far slower ({why}). Remedy: {remedy}. Pass "
        f"backend='reference' to choose it knowingly. (Warned once.)",
        UserWarning,
        stacklevel=3,
    )


def select_backend(name: str, device: torch.device):
    """The backend object for ``name`` ("auto" or a registered name, :func:`.validate.check_backend`) on ``device``.

    "auto" takes the first engine of the device type's preference order that runs here; when
    none does and only the (slow) reference is left, it warns once per device type, naming the remedy.
    """
    if name == "auto":
        backend, passed_over = _auto_backend(device)
        if backend is BACKENDS["reference"]:
            _warn_slow_fallback(device, passed_over)
        return backend
    backend = BACKENDS[name]
    reason = backend.unavailable_reason()
    if reason is not None:
        raise RuntimeError(f"backend {name!r} is not available: {reason}")
    if not backend.supports(device):
        raise RuntimeError(f"backend {name!r} does not run on device {device}")
    return backend


def forward(engine: Backend, x: torch.Tensor, field: Field, sampling: Sampling) -> torch.Tensor:
    """The forward of a checked call (:func:`.call.parse_call`), for every kind of field: ``x`` (N, C, D, H, W),
    logical NCDHW, sampled at ``field`` by ``engine`` -> (N, C, Do, Ho, Wo), laid out like ``x``.

    An affine field whose theta is not finite samples at :func:`.affine.explicit_grid` (the
    grid ``F.affine_grid`` builds), so that NaN and infinity land as that path places them.
    """
    if 0 in x.shape or 0 in field.out_sizes:
        out_shape = tuple(x.shape[:2]) + tuple(field.out_sizes)
        return torch.empty(out_shape, dtype=x.dtype, device=x.device, memory_format=memory_format_of(x)).zero_()
    if field.theta is not None and not (
        field.derived["finite theta"] if "finite theta" in field.derived else _finite(field)
    ):
        return engine.forward(x, _explicit(field, x, sampling), sampling)
    return engine.forward(x, field, sampling)


def backward(
    engine: Backend,
    grad: torch.Tensor,
    x: torch.Tensor,
    field: Field,
    sampling: Sampling,
    outputs: Outputs,
    deterministic: bool | None = None,
) -> Gradients:
    """The backward of a checked call, for every kind of field, on logical NCDHW tensors: :class:`.sampling.Gradients`
    (dx, the field tensor's, theta's) as the engine lays them out (:class:`Backend`), None where ``outputs`` (which
    names only gradients the field has) leaves one out. ``deterministic`` None follows torch's flag (read by the
    engine that has a choice)."""
    if not (outputs.dx or outputs.dfield or outputs.dtheta):
        return Gradients()
    if 0 in grad.shape or 0 in x.shape:
        return Gradients(
            torch.zeros_like(x, memory_format=memory_format_of(x)) if outputs.dx else None,
            torch.zeros_like(field.tensor, memory_format=field.gradient_format()) if outputs.dfield else None,
            torch.zeros_like(field.theta) if outputs.dtheta else None,
        )
    if field.theta is not None and not (
        field.derived["finite theta"] if "finite theta" in field.derived else _finite(field)
    ):
        return _explicit_backward(engine, grad, x, field, sampling, outputs, deterministic)
    return engine.backward(grad, x, field, sampling, outputs, deterministic)


def _finite(field: Field) -> bool:
    """Whether the field's theta is finite, measured once per record (a forward and its backward share it)."""
    finite = field.derived["finite theta"] = bool(torch.isfinite(field.theta).all())
    return finite


def _explicit(field: Field, x: torch.Tensor, sampling: Sampling) -> Field:
    """The grid of an affine field (:func:`.affine.explicit_grid`; a B-spline's displacement as its dense field), for
    a theta that is not finite."""
    displacement = field.tensor
    if field.kind.spline:
        displacement = dense_displacement(field.tensor, field.out_sizes, field.parameters)
    return Field.grid(
        explicit_grid(field.theta, field.out_sizes, sampling.align_corners, tuple(x.shape[2:]), displacement)
    )


def _explicit_backward(engine, grad, x, field: Field, sampling: Sampling, outputs: Outputs, deterministic: bool):
    """The backward through the explicit grid (for a theta that is not finite): the grid's gradient by the engine,
    then theta's and the displacement's (or control points') by autograd through :func:`.affine.explicit_grid`."""
    theta = field.theta.detach().requires_grad_(outputs.dtheta)
    displacement = None if field.tensor is None else field.tensor.detach().requires_grad_(outputs.dfield)
    leaves = Field(field.kind, displacement, theta, field.out_sizes, field.parameters)
    with torch.enable_grad():
        grid = _explicit(leaves, x, sampling).tensor
    dx, dgrid, _ = engine.backward(
        grad,
        x,
        Field.grid(grid.detach()),
        sampling,
        Outputs(outputs.dx, outputs.dtheta or outputs.dfield),
        deterministic,
    )
    wanted = [leaf for leaf in (theta, displacement) if leaf is not None and leaf.requires_grad]
    found = dict(zip(map(id, wanted), torch.autograd.grad(grid, wanted, dgrid))) if wanted else {}
    return Gradients(dx, found.get(id(displacement)), found.get(id(theta)))


def available_backends() -> list[str]:
    """Names of the backends that can run here (``"auto"`` picks among them)."""
    return [name for name, backend in BACKENDS.items() if backend.unavailable_reason() is None]


def describe_backends() -> list[dict]:
    """One entry per backend: ``name``, ``available``, ``reason`` (why not, or None) and the
    ``device_types`` (of :data:`DEVICE_TYPES`) whose tensors it runs."""
    return [
        {
            "name": name,
            "available": backend.unavailable_reason() is None,
            "reason": backend.unavailable_reason(),
            "device_types": [kind for kind in DEVICE_TYPES if backend.supports(torch.device(kind))],
        }
        for name, backend in BACKENDS.items()
    ]


def auto_choices() -> dict[str, str | None]:
    """The backend "auto" picks here for each device type of :data:`DEVICE_TYPES` (without warning);
    None for a type that has no device here (CUDA without a GPU)."""
    present = {"cpu": True, "cuda": torch.cuda.is_available()}
    return {kind: _auto_backend(torch.device(kind))[0].name if present[kind] else None for kind in DEVICE_TYPES}


def cpu_engine() -> str | None:
    """How the CPU engine compiles and runs here: its Numba path (docs/runtime.md) and the threads its parts
    run on; None where it cannot be imported. Asking chooses the threads, as the first call would."""
    if isinstance(BACKENDS["numba"], _Missing):
        return None
    from .cpu import jit, pool

    threads = {"team": "torch's OpenMP team", "workers": "the engine's worker threads"}[pool.route()]
    return f"{jit.compile_path()}; parts on {threads}"


def library_versions() -> dict[str, str]:
    """Installed versions of torch, numba and triton ("not installed" where absent); nothing is imported."""
    versions = {}
    for package in ("torch", "numba", "triton"):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = "not installed"
    return versions
