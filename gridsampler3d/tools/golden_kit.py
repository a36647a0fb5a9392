"""Cases for judging another implementation of the backward: the case set, its folders and their files.

A case folder (``gridsampler3d cases``) holds, with shapes in the case's data format:

    case.json          dtype, data_format, the three attributes, file names and shapes
    grad.npy           (N, C, Do, Ho, Wo) or (N, Do, Ho, Wo, C), in the case's dtype
    input.npy          x: (N, C, Di, Hi, Wi) or (N, Di, Hi, Wi, C)
    grid.npy           (N, Do, Ho, Wo, 3)
    dx_golden.npy      like x, float64
    dgrid_golden.npy   like grid, float64

NumPy has no bfloat16: a bfloat16 case's inputs are ``grad.bin``, ``input.bin`` and
``grid.bin``, raw little-endian values in C order, two bytes each. The golden is
:func:`gridsampler3d.precision.golden_backward`: PyTorch's CPU backward in float64 on the
upcast inputs (for bicubic, which PyTorch lacks in 3-D, this library's float64 reference).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .. import precision
from ..call import parse_call, parse_options
from ..dtypes import DTYPES, dtype_name
from ..modes import parse_data_format
from ..sampling import FieldKind

__all__ = [
    "CASE_SET",
    "CaseSpec",
    "Case",
    "CaseFileError",
    "dtype_name",
    "case_set",
    "case_operands",
    "write_case",
    "write_cases",
    "write_array",
    "read_array",
    "read_case",
    "make_case",
    "case_from_npy",
]

INPUTS = ("grad", "input", "grid")
# A uniform grid reaches this far past [-1, 1] on every side, so that every padding rule acts.
GRID_BOUND = 1.2


class CaseFileError(ValueError):
    """A file that cannot serve as a case's array; the message names it and what was expected."""


@dataclass(frozen=True)
class CaseSpec:
    """One entry of the case set, before its dtype is chosen.

    ``grid_kind``: "uniform" (coordinates uniform in [-1.2, 1.2]), "far" (a third of them
    far outside, up to 1e12 where the dtype reaches it: beyond int32 once unnormalised) or
    "nonfinite" (a tenth of them NaN, +inf or -inf).
    """

    interpolation_mode: str
    padding_mode: str
    align_corners: bool
    data_format: str
    grid_kind: str
    batch: int
    channels: int
    input_size: tuple[int, int, int]
    output_size: tuple[int, int, int]


CASE_SET = (
    CaseSpec("bilinear", "zeros", False, "NCDHW", "uniform", 1, 2, (5, 6, 7), (4, 5, 3)),
    CaseSpec("nearest", "zeros", False, "NCDHW", "far", 2, 3, (3, 5, 7), (3, 4, 5)),
    CaseSpec("bicubic", "zeros", False, "NCDHW", "nonfinite", 1, 1, (7, 5, 3), (5, 3, 4)),
    CaseSpec("bilinear", "border", False, "NCDHW", "far", 1, 4, (4, 7, 5), (2, 6, 5)),
    CaseSpec("nearest", "border", False, "NDHWC", "nonfinite", 2, 2, (6, 5, 4), (5, 5, 3)),
    CaseSpec("bicubic", "border", False, "NDHWC", "uniform", 1, 2, (5, 6, 7), (4, 5, 3)),
    CaseSpec("bilinear", "reflection", False, "NDHWC", "nonfinite", 2, 3, (3, 5, 7), (3, 4, 5)),
    CaseSpec("nearest", "reflection", False, "NDHWC", "uniform", 1, 1, (7, 5, 3), (5, 3, 4)),
    CaseSpec("bicubic", "reflection", False, "NCDHW", "far", 1, 4, (4, 7, 5), (2, 6, 5)),
    CaseSpec("bilinear", "zeros", True, "NCDHW", "uniform", 2, 2, (6, 5, 4), (5, 5, 3)),
    CaseSpec("nearest", "zeros", True, "NCDHW", "far", 1, 2, (5, 6, 7), (4, 5, 3)),
    CaseSpec("bicubic", "zeros", True, "NCDHW", "nonfinite", 2, 3, (3, 5, 7), (3, 4, 5)),
    CaseSpec("bilinear", "border", True, "NDHWC", "far", 1, 1, (7, 5, 3), (5, 3, 4)),
    CaseSpec("nearest", "border", True, "NDHWC", "nonfinite", 1, 4, (4, 7, 5), (2, 6, 5)),
    CaseSpec("bicubic", "border", True, "NDHWC", "uniform", 2, 2, (6, 5, 4), (5, 5, 3)),
    CaseSpec("bilinear", "reflection", True, "NDHWC", "nonfinite", 1, 2, (5, 6, 7), (4, 5, 3)),
    CaseSpec("nearest", "reflection", True, "NCDHW", "uniform", 2, 3, (3, 5, 7), (3, 4, 5)),
    CaseSpec("bicubic", "reflection", True, "NCDHW", "far", 1, 1, (7, 5, 3), (5, 3, 4)),
    CaseSpec("bilinear", "border", False, "NDHWC", "uniform", 1, 1, (1, 4, 9), (3, 1, 5)),
    CaseSpec("bicubic", "zeros", False, "NCDHW", "uniform", 2, 3, (6, 5, 7), (4, 3, 5)),
    CaseSpec("bicubic", "reflection", True, "NDHWC", "nonfinite", 1, 3, (4, 5, 3), (3, 4, 4)),
    CaseSpec("nearest", "border", False, "NDHWC", "uniform", 2, 4, (9, 8, 7), (7, 6, 5)),
    CaseSpec("bilinear", "reflection", True, "NCDHW", "far", 1, 2, (1, 3, 1), (2, 3, 2)),
    CaseSpec("bilinear", "zeros", False, "NCDHW", "uniform", 1, 3, (11, 9, 13), (8, 7, 9)),
)
"""The case set, in its fixed order. The first 18 entries cover every (mode, padding, align_corners)
once and every (mode, grid kind) twice; the last six add sizes of 1, larger volumes and float16
tricubic on non-finite grid values. Dtypes take turns along the order (see :func:`case_set`)."""


@dataclass(frozen=True)
class Case:
    """A case to judge: attributes (canonical names) and operands in ``dtype`` and ``data_format``.

    grad (N, C, Do, Ho, Wo) or (N, Do, Ho, Wo, C); input (N, C, Di, Hi, Wi) or
    (N, Di, Hi, Wi, C); grid (N, Do, Ho, Wo, 3). dx is shaped like input, dgrid like grid.
    """

    dtype: torch.dtype
    data_format: str
    interpolation_mode: str
    padding_mode: str
    align_corners: bool
    grad: torch.Tensor
    input: torch.Tensor
    grid: torch.Tensor

    def attributes(self) -> dict:
        """The keyword arguments of the backward that describe this case (modes, align_corners, data_format)."""
        return {
            "interpolation_mode": self.interpolation_mode,
            "padding_mode": self.padding_mode,
            "align_corners": self.align_corners,
            "data_format": self.data_format,
        }


def case_set(count: int | None = None, dtypes=tuple(DTYPES)) -> list[tuple[CaseSpec, str]]:
    """The first ``count`` (default: all) entries of :data:`CASE_SET`, each with its dtype name.

    Entry i takes ``dtypes[i % len(dtypes)]``, so any ``count`` of at least ``len(dtypes)``
    covers every dtype asked for.
    """
    dtypes = list(dict.fromkeys(dtypes))
    unknown = [name for name in dtypes if name not in DTYPES]
    if unknown or not dtypes:
        raise ValueError(f"dtypes must be among {', '.join(DTYPES)}; got {', '.join(unknown) or 'none'}")
    count = len(CASE_SET) if count is None else count
    if not 1 <= count <= len(CASE_SET):
        raise ValueError(f"count must be between 1 and {len(CASE_SET)}; got {count}")
    return [(spec, dtypes[index % len(dtypes)]) for index, spec in enumerate(CASE_SET[:count])]


def _grid(rng: np.random.Generator, kind: str, shape: tuple, dtype: torch.dtype) -> np.ndarray:
    """float64 grid values of ``kind`` (see :class:`CaseSpec`), to be rounded to ``dtype``: ``shape``."""
    grid = rng.uniform(-GRID_BOUND, GRID_BOUND, shape)
    flat = grid.reshape(-1)
    if kind == "far":
        # float16 stops at 65504: its far values stay finite, and are no "nonfinite" case.
        top = 4.5 if dtype == torch.float16 else 12.0
        chosen = np.flatnonzero(rng.random(flat.size) < 1 / 3)
        flat[chosen] = rng.choice([-1.0, 1.0], chosen.size) * 10.0 ** rng.uniform(0.3, top, chosen.size)
    elif kind == "nonfinite":
        chosen = rng.choice(flat.size, size=max(3, flat.size // 10), replace=False)
        flat[chosen] = np.resize([np.nan, np.inf, -np.inf], chosen.size)
    return grid


def case_operands(spec: CaseSpec, dtype: torch.dtype, *, seed: int, index: int):
    """``(grad, input, grid)`` of entry ``index`` of the set: tensors in ``dtype``, grad and input in
    ``spec.data_format``. The values depend only on ``seed`` and ``index``."""
    rng = np.random.default_rng([seed, index])
    x = rng.standard_normal((spec.batch, spec.channels, *spec.input_size))
    grad = rng.standard_normal((spec.batch, spec.channels, *spec.output_size))
    grid = _grid(rng, spec.grid_kind, (spec.batch, *spec.output_size, 3), dtype)
    if parse_data_format(spec.data_format).value == "NDHWC":
        x, grad = np.moveaxis(x, 1, -1), np.moveaxis(grad, 1, -1)
    return tuple(torch.from_numpy(np.ascontiguousarray(array)).to(dtype) for array in (grad, x, grid))


def folder_name(index: int, spec: CaseSpec, dtype: str) -> str:
    """A case folder's name: its place in the set and what it holds."""
    corners = "ac" if spec.align_corners else "noac"
    return (
        f"{index:03d}-{dtype}-{spec.interpolation_mode}-{spec.padding_mode}-{corners}-{spec.data_format}-"
        f"{spec.grid_kind}"
    )


def write_case(folder, spec: CaseSpec, dtype: str, *, seed: int, index: int) -> Path:
    """Write entry ``index`` of the set in ``dtype`` (a name) into ``folder``: inputs, golden, case.json."""
    folder = Path(folder)
    grad, x, grid = case_operands(spec, DTYPES[dtype], seed=seed, index=index)
    attributes = {
        "interpolation_mode": spec.interpolation_mode,
        "padding_mode": spec.padding_mode,
        "align_corners": spec.align_corners,
    }
    dx, dgrid = precision.golden_backward(grad, x, grid, **attributes, data_format=spec.data_format)
    suffix = ".bin" if dtype == "bfloat16" else ".npy"
    files = {
        "grad": "grad" + suffix,
        "input": "input" + suffix,
        "grid": "grid" + suffix,
        "dx_golden": "dx_golden.npy",
        "dgrid_golden": "dgrid_golden.npy",
    }
    folder.mkdir(parents=True, exist_ok=True)
    for key, tensor in zip(files, (grad, x, grid, dx, dgrid)):
        write_array(folder / files[key], tensor)
    shapes = {"grad": grad, "input": x, "grid": grid, "dx": dx, "dgrid": dgrid}
    description = {
        "dtype": dtype,
        "data_format": spec.data_format,
        **attributes,
        "files": files,
        "shapes": {key: list(tensor.shape) for key, tensor in shapes.items()},
    }
    text = json.dumps(description, indent=2)
    # A shape reads best on one line: [1, 2, 5, 6, 7].
    text = re.sub(r"\[\s+([\d,\s]*?)\s+\]", lambda match: "[" + " ".join(match.group(1).split()) + "]", text)
    (folder / "case.json").write_text(text + "\n")
    return folder


def write_cases(out, *, count: int | None = None, seed: int = 0, dtypes=tuple(DTYPES), echo=None) -> list[Path]:
    """Write the first ``count`` cases of the set (see :func:`case_set`) into folders under ``out``.

    ``echo``, when given, is called with each folder as it is written. Returns the folders.
    """
    if seed < 0:
        raise ValueError(f"seed must be a non-negative integer; got {seed}")
    folders = []
    for index, (spec, dtype) in enumerate(case_set(count, dtypes)):
        folders.append(write_case(Path(out) / folder_name(index, spec, dtype), spec, dtype, seed=seed, index=index))
        if echo is not None:
            echo(folders[-1])
    return folders


def write_array(path, tensor: torch.Tensor) -> None:
    """Save ``tensor`` as ``.npy``, or as raw little-endian values in C order when ``path`` ends in ``.bin``."""
    path, tensor = Path(path), tensor.detach().cpu().contiguous()
    if path.suffix == ".bin":
        # NumPy has no bfloat16: its two bytes travel as int16.
        array = (tensor.view(torch.int16) if tensor.dtype == torch.bfloat16 else tensor).numpy()
        array.astype(array.dtype.newbyteorder("<")).tofile(path)
    elif tensor.dtype == torch.bfloat16:
        raise ValueError(f"{path}: .npy cannot hold bfloat16; write it as .bin")
    else:
        np.save(path, tensor.numpy())


def _bfloat16_hint(dtype: torch.dtype) -> str:
    return "; .npy cannot hold bfloat16: write raw little-endian .bin" if dtype == torch.bfloat16 else ""


def _read_npy(path: Path, label: str, dtype: torch.dtype | None) -> torch.Tensor:
    """A .npy file's array as a tensor; float16, float32 or float64 only, never unpickled."""
    expected = "a float16, float32 or float64 array" if dtype is None else f"a {dtype_name(dtype)} array"
    try:
        array = np.load(path, allow_pickle=False)
    except ValueError as error:
        if "pickle" in str(error):
            raise CaseFileError(
                f"{label}: {path} holds pickled Python objects, which are never unpickled; expected {expected}"
            ) from None
        raise CaseFileError(f"{label}: {path} is not a readable .npy array ({error}); expected {expected}") from None
    except (OSError, EOFError) as error:
        raise CaseFileError(f"{label}: {path} is not a readable .npy array ({error}); expected {expected}") from None
    if not isinstance(array, np.ndarray):
        raise CaseFileError(f"{label}: {path} is an archive of arrays; expected {expected} in a .npy file")
    if array.dtype.kind != "f" or array.dtype.itemsize not in (2, 4, 8):
        raise CaseFileError(f"{label}: {path} holds {array.dtype}; expected {expected}{_bfloat16_hint(dtype)}")
    return torch.from_numpy(array.astype(array.dtype.newbyteorder("="), copy=False))


def _read_bin(path: Path, label: str, dtype: torch.dtype | None, shape) -> torch.Tensor:
    """Raw little-endian values in C order of a known dtype and shape."""
    if dtype is None or shape is None:
        raise CaseFileError(
            f"{label}: {path} is raw .bin, whose dtype and shape only a case folder gives: "
            "use --case, or give a .npy file"
        )
    width = torch.finfo(dtype).bits // 8
    expected = math.prod(shape) * width
    size = path.stat().st_size
    if size != expected:
        raise CaseFileError(
            f"{label}: {path} has {size} bytes; expected {expected} (shape {tuple(shape)} of "
            f"{dtype_name(dtype)}, {width} bytes each, little-endian)"
        )
    if dtype == torch.bfloat16:
        raw = np.fromfile(path, dtype="<i2").astype(np.int16)
        return torch.from_numpy(raw).view(torch.bfloat16).reshape(tuple(shape))
    values = np.fromfile(path, dtype=np.dtype(dtype_name(dtype)).newbyteorder("<"))
    return torch.from_numpy(values.astype(dtype_name(dtype))).reshape(tuple(shape))


def read_array(path, *, label: str, dtype: torch.dtype | None = None, shape=None) -> torch.Tensor:
    """Read a ``.npy`` or ``.bin`` file as a CPU tensor, checking its dtype and shape where given.

    A ``.bin`` file needs ``dtype`` and ``shape``. Raises :class:`CaseFileError` naming
    ``label`` (the flag or file that gave the path), the file and what was expected.
    """
    path = Path(path)
    if path.suffix not in (".npy", ".bin"):
        raise CaseFileError(f"{label}: {path} must be a .npy file or a raw little-endian .bin file")
    if not path.is_file():
        raise CaseFileError(f"{label}: no such file: {path}")
    tensor = _read_bin(path, label, dtype, shape) if path.suffix == ".bin" else _read_npy(path, label, dtype)
    if dtype is not None and tensor.dtype != dtype:
        raise CaseFileError(
            f"{label}: {path} holds {dtype_name(tensor.dtype)}; expected {dtype_name(dtype)}{_bfloat16_hint(dtype)}"
        )
    if shape is not None and tuple(tensor.shape) != tuple(shape):
        raise CaseFileError(f"{label}: {path} has shape {tuple(tensor.shape)}; expected {tuple(shape)}")
    return tensor


def make_case(grad, input, grid, *, interpolation_mode, padding_mode, align_corners, data_format) -> Case:
    """A :class:`Case` of checked operands (one dtype, consistent shapes) and normalised attribute names."""
    options = parse_options(interpolation_mode, padding_mode, align_corners, data_format=data_format)
    call = parse_call(FieldKind.GRID, options, input, grid=grid, grad=grad, runs=False, where="golden kit")
    sampling, layout = options.sampling, options.data_format
    return Case(
        dtype=call.x.dtype,
        data_format=layout.value,
        interpolation_mode=sampling.interpolation.name.lower(),
        padding_mode=sampling.padding.name.lower(),
        align_corners=sampling.align_corners,
        grad=_caller_layout(call.grad, layout),
        input=_caller_layout(call.x, layout),
        grid=call.field.tensor,
    )


def _caller_layout(tensor, layout):
    """A logical NCDHW view back in ``layout`` (a view of the same tensor, as the caller gave it)."""
    return tensor.permute(0, 2, 3, 4, 1) if layout.value == "NDHWC" else tensor


def _case_field(description: dict, key: str, kind: type, path: Path):
    if key not in description:
        raise CaseFileError(f"--case: {path} has no {key!r}")
    if not isinstance(description[key], kind):
        raise CaseFileError(f"--case: {path}'s {key!r} must be a {kind.__name__}; got {description[key]!r}")
    return description[key]


def _shape(shapes: dict, name: str, path: Path) -> tuple[int, ...]:
    shape = _case_field(shapes, name, list, path)
    if not all(isinstance(size, int) and size >= 0 for size in shape):
        raise CaseFileError(f"--case: {path}'s shape of {name} must be a list of sizes; got {shape!r}")
    return tuple(shape)


def read_case(folder) -> Case:
    """The case of a folder written by :func:`write_case` (its case.json and input files)."""
    path = Path(folder) / "case.json"
    if not path.is_file():
        raise CaseFileError(f"--case: no case.json in {folder}")
    try:
        description = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CaseFileError(f"--case: {path} is not readable JSON ({error})") from None
    if not isinstance(description, dict):
        raise CaseFileError(f"--case: {path} must hold a JSON object")
    dtype = _case_field(description, "dtype", str, path)
    if dtype not in DTYPES:
        raise CaseFileError(f"--case: {path}'s dtype must be one of {', '.join(DTYPES)}; got {dtype!r}")
    files = _case_field(description, "files", dict, path)
    shapes = _case_field(description, "shapes", dict, path)
    operands = {
        name: read_array(
            Path(folder) / _case_field(files, name, str, path),
            label="--case",
            dtype=DTYPES[dtype],
            shape=_shape(shapes, name, path),
        )
        for name in INPUTS
    }
    attributes = {
        key: description.get(key) for key in ("interpolation_mode", "padding_mode", "align_corners", "data_format")
    }
    try:
        return make_case(**operands, **attributes)
    except (TypeError, ValueError) as error:
        raise CaseFileError(f"--case: {path}: {error}") from None


def _exactly_in(tensor: torch.Tensor, dtype: torch.dtype, label: str, path) -> torch.Tensor:
    """``tensor`` converted to ``dtype``, which must hold every value exactly."""
    converted = tensor.to(dtype)
    back = converted.to(tensor.dtype)
    if not bool(((back == tensor) | (back.isnan() & tensor.isnan())).all()):
        raise CaseFileError(
            f"{label}: {path} holds {dtype_name(tensor.dtype)} values that {dtype_name(dtype)} "
            f"cannot hold exactly; expected values already rounded to {dtype_name(dtype)}"
        )
    return converted


def case_from_npy(grad, input, grid, *, dtype: torch.dtype | None = None, **attributes) -> Case:
    """A case from three .npy paths (``--grad``, ``--input``, ``--grid``) and the attributes of :func:`make_case`.

    The dtype is ``dtype`` when given (arrays of another float dtype are converted, and must be
    exact in it: bfloat16 values stored as float32, say), else the dtype of ``input``'s array,
    which grad's and grid's must share.
    """
    paths = {"grad": grad, "input": input, "grid": grid}
    arrays = {name: read_array(path, label=f"--{name}") for name, path in paths.items()}
    target = dtype or arrays["input"].dtype
    for name, array in arrays.items():
        if array.dtype == target:
            continue
        if dtype is None:
            raise CaseFileError(
                f"--{name}: {paths[name]} holds {dtype_name(array.dtype)}; expected "
                f"{dtype_name(target)}, the dtype of --input (or give --dtype)"
            )
        arrays[name] = _exactly_in(array, target, f"--{name}", paths[name])
    return make_case(**arrays, **attributes)
