"""Attribute enums and their aliases.

Every attribute is normalised here, once, at the API edge. Below the API only these
enums (which are ``int`` subclasses carrying the aclnn integer codes) travel.
"""

from __future__ import annotations

import enum

import numpy as np

__all__ = [
    "Interpolation",
    "Padding",
    "DataFormat",
    "DisplacementFormat",
    "parse_interpolation",
    "parse_padding",
    "parse_data_format",
    "parse_displacement_format",
    "parse_align_corners",
    "parse_output_mask",
]


class Interpolation(enum.IntEnum):
    """Interpolation mode; the values are the aclnn integer codes."""

    BILINEAR = 0  # trilinear in 3-D: 8 taps
    NEAREST = 1
    BICUBIC = 2  # tricubic in 3-D: 64 taps


class Padding(enum.IntEnum):
    """Padding mode; the values are the aclnn integer codes."""

    ZEROS = 0
    BORDER = 1
    REFLECTION = 2


class DataFormat(str, enum.Enum):
    """Layout of ``grad``, ``input`` and ``dx`` (the grid is always ``(N, Do, Ho, Wo, 3)``)."""

    NCDHW = "NCDHW"
    NDHWC = "NDHWC"


class DisplacementFormat(str, enum.Enum):
    """Layout of a displacement field for the fused warp; components are (dz, dy, dx) in voxels either way."""

    N3DHW = "N3DHW"  # (N, 3, D, H, W): MONAI's and VoxelMorph's layout
    NDHW3 = "NDHW3"  # (N, D, H, W, 3)


# {Interpolation: {"bilinear": Interpolation.BILINEAR, ...}, Padding: {...}}: each member by its
# lower-case name. A plain dict, not a cached function: torch.export traces these parsers, and
# Dynamo warns at every cached function it meets.
_LOWER_NAMES = {
    enum_type: {member.name.lower(): member for member in enum_type} for enum_type in (Interpolation, Padding)
}


def _parse_enum(value, enum_type, what: str):
    # The common cases first, by exact type (no call): a member (the engines' own calls), a lower-case name.
    if type(value) is enum_type:
        return value
    lower_names = _LOWER_NAMES[enum_type]
    if type(value) is str and value in lower_names:
        return lower_names[value]
    if isinstance(value, enum_type):
        return value
    if type(value) is int and value in enum_type._value2member_map_:  # an aclnn code (the custom ops pass these)
        return enum_type(value)
    names = ", ".join(f"{member.name.lower()!r} or {member.value}" for member in enum_type)
    if isinstance(value, bool):
        raise TypeError(f"{what} must be one of {names}; got the bool {value!r}")
    if isinstance(value, str):
        try:
            return enum_type[value.strip().upper()]
        except KeyError:
            raise ValueError(f"{what} must be one of {names}; got {value!r}") from None
    if isinstance(value, int) or _is_numpy_scalar(value, "iu"):
        try:
            return enum_type(int(value))
        except ValueError:
            raise ValueError(f"{what} must be one of {names}; got {value!r}") from None
    raise TypeError(f"{what} must be a str or an int ({names}); got {type(value).__name__} {value!r}")


def _parse_format(value, format_type, what: str):
    """A layout name (case-insensitive str) or a member of ``format_type`` → that member."""
    if type(value) is format_type:
        return value
    if type(value) is str and value in format_type._value2member_map_:  # the common spelling, at no cost
        return format_type._value2member_map_[value]
    if isinstance(value, format_type):
        return value
    names = " or ".join(repr(member.value) for member in format_type)
    if not isinstance(value, str):
        raise TypeError(f"{what} must be the str {names}; got {type(value).__name__} {value!r}")
    try:
        return format_type(value.strip().upper())
    except ValueError:
        raise ValueError(f"{what} must be {names}; got {value!r}") from None


def _is_numpy_scalar(value, kinds: str) -> bool:
    """Whether ``value`` is a NumPy scalar (or 0-d array) of a dtype kind in ``kinds``: np.int64(1) is as good
    as 1 here, np.bool_(True) as True. A torch tensor is none (its dtype has no kind): attributes are Python or
    NumPy values."""
    return isinstance(value, (np.generic, np.ndarray)) and value.shape == () and value.dtype.kind in kinds


def parse_interpolation(value) -> Interpolation:
    """``"bilinear"``/0, ``"nearest"``/1, ``"bicubic"``/2 → :class:`Interpolation`."""
    return _parse_enum(value, Interpolation, "interpolation_mode")


def parse_padding(value) -> Padding:
    """``"zeros"``/0, ``"border"``/1, ``"reflection"``/2 → :class:`Padding`."""
    return _parse_enum(value, Padding, "padding_mode")


def parse_data_format(value) -> DataFormat:
    """``"NCDHW"`` or ``"NDHWC"`` (case-insensitive) → :class:`DataFormat`."""
    return _parse_format(value, DataFormat, "data_format")


def parse_displacement_format(value) -> DisplacementFormat:
    """``"N3DHW"`` or ``"NDHW3"`` (case-insensitive) → :class:`DisplacementFormat`."""
    return _parse_format(value, DisplacementFormat, "displacement_format")


def _is_bool(value) -> bool:
    return isinstance(value, bool) or _is_numpy_scalar(value, "b")


def parse_align_corners(value) -> bool:
    """A Python or NumPy bool → ``bool``; anything else is a ``TypeError``."""
    if value is True or value is False:
        return value
    if not _is_bool(value):
        raise TypeError(f"align_corners must be a bool; got {type(value).__name__} {value!r}")
    return bool(value)


def parse_output_mask(value, names: str = "dx, dgrid") -> tuple[bool, ...]:
    """Bools, one per output (compute dx, compute dgrid) → a tuple of bools; ``names`` names the outputs, comma
    separated, in errors and in how many bools it takes."""
    count = len(names.split(","))
    what = "a pair of" if count == 2 else f"{count}"
    try:
        items = tuple(value)
    except TypeError:
        raise TypeError(f"output_mask must be {what} bools ({names}); got {type(value).__name__} {value!r}") from None
    if len(items) != count or not all(_is_bool(item) for item in items):
        raise TypeError(f"output_mask must be {what} bools ({names}); got {value!r}")
    return tuple(bool(item) for item in items)
