"""A matrix of bad inputs over every public name: each gets a TypeError or ValueError (NotImplementedError for meta
tensors where a kernel would have to run) that names the argument, and no caller's tensor changes.

Every case starts from a call that works (checked first) and changes one argument. The kinds of bad value are
the same for every name that takes that kind of argument: tensors (types, NumPy where torch is needed, ranks,
shapes, dtypes, devices, meta tensors), modes, flags, layouts, sizes and module arguments.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import gridsampler3d as gs


@dataclasses.dataclass
class Name:
    """A public callable, the keyword arguments of a call that works, and which arguments are what."""

    label: str
    call: object
    good: dict
    tensors: tuple  # the tensor arguments, by the names the messages use
    arrays: bool  # whether NumPy arrays are taken
    runs: bool = True  # whether a kernel runs (meta tensors refused)
    attributes: tuple = ("mode", "padding_mode", "align_corners")
    extra: dict = dataclasses.field(default_factory=dict)  # more bad values: argument -> [(value, error)]
    message_names: dict = dataclasses.field(default_factory=dict)  # argument -> the name its messages use
    # (argument, label) of tensor values this name hands to PyTorch's own function, whose errors are PyTorch's
    passed_on: tuple = ()


def _operands():
    generator = torch.Generator().manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float32)

    return {
        "x": randn(1, 2, 4, 5, 6),
        "grid": randn(1, 3, 4, 2, 3).clamp(-1, 1),
        "grad": randn(1, 2, 3, 4, 2),
        "displacement": randn(1, 3, 4, 5, 6),
        "warp_grad": randn(1, 2, 4, 5, 6),
        "theta": torch.eye(3, 4).unsqueeze(0) + 0.05 * randn(1, 3, 4),
        "affine_grad": randn(1, 2, 3, 3, 3),
    }


OPERANDS = _operands()
MODES = {"mode": "interpolation_mode", "padding_mode": "padding_mode", "align_corners": "align_corners"}


def _patched_grid_sample(**kwargs):
    with gs.patched():
        return F.grid_sample(**kwargs)


def _names() -> list[Name]:
    o = OPERANDS
    operator_attributes = ("interpolation_mode", "padding_mode", "align_corners", "data_format", "backend")
    sizes = {"size": [((4, 4), TypeError), ((4, 0, 4), ValueError), ("abc", TypeError), ((4.0, 4, 4), TypeError)]}
    return [
        Name(
            "grid_sampler3d",
            gs.grid_sampler3d,
            dict(input=o["x"], grid=o["grid"]),
            ("input", "grid"),
            arrays=True,
            attributes=operator_attributes,
        ),
        Name(
            "grid_sampler3d_backward",
            gs.grid_sampler3d_backward,
            dict(grad=o["grad"], input=o["x"], grid=o["grid"]),
            ("grad", "input", "grid"),
            arrays=True,
            attributes=(*operator_attributes, "output_mask", "deterministic"),
        ),
        Name(
            "grid_sample",
            gs.grid_sample,
            dict(input=o["x"], grid=o["grid"]),
            ("input", "grid"),
            arrays=False,
            runs=False,
            attributes=("mode", "padding_mode", "align_corners", "data_format"),
            passed_on=(("input", "4-D"),),  # 4-D input is F.grid_sample's 2-D sampling
        ),
        Name(
            "F.grid_sample patched (bicubic)",
            _patched_grid_sample,
            dict(input=o["x"], grid=o["grid"], mode="bicubic", align_corners=False),
            ("input", "grid"),
            arrays=False,
            runs=False,
            attributes=("padding_mode",),
            passed_on=(("input", "4-D"), ("input", "6-D")),  # only 5-D bicubic is this library's
        ),
        Name(
            "warp",
            gs.warp,
            dict(volume=o["x"], displacement=o["displacement"]),
            ("volume", "displacement"),
            arrays=False,
            runs=False,
            attributes=("mode", "padding_mode", "align_corners", "data_format", "displacement_format"),
        ),
        Name(
            "warp3d",
            gs.warp3d,
            dict(volume=o["x"], displacement=o["displacement"]),
            ("volume", "displacement"),
            arrays=True,
            attributes=(*operator_attributes, "displacement_format"),
        ),
        Name(
            "warp3d_backward",
            gs.warp3d_backward,
            dict(grad=o["warp_grad"], volume=o["x"], displacement=o["displacement"]),
            ("grad", "volume", "displacement"),
            arrays=True,
            attributes=(*operator_attributes, "displacement_format", "output_mask", "deterministic"),
        ),
        Name(
            "affine_warp",
            gs.affine_warp,
            dict(volume=o["x"], theta=o["theta"], size=(3, 3, 3)),
            ("volume", "theta"),
            arrays=False,
            runs=False,
            attributes=("mode", "padding_mode", "align_corners", "data_format"),
            extra=sizes,
        ),
        Name(
            "affine_warp3d",
            gs.affine_warp3d,
            dict(volume=o["x"], theta=o["theta"], size=(3, 3, 3)),
            ("volume", "theta"),
            arrays=True,
            attributes=operator_attributes,
            extra=sizes,
        ),
        Name(
            "affine_warp3d_backward",
            gs.affine_warp3d_backward,
            dict(grad=o["affine_grad"], volume=o["x"], theta=o["theta"], size=(3, 3, 3)),
            ("grad", "volume", "theta"),
            arrays=True,
            attributes=(*operator_attributes, "output_mask", "deterministic"),
            extra=sizes,
        ),
        Name(
            "integrate_velocity",
            gs.integrate_velocity,
            dict(velocity=o["displacement"], steps=2),
            ("velocity",),
            arrays=False,
            runs=False,
            attributes=("mode", "padding_mode", "align_corners", "displacement_format"),
            extra={"steps": [(-1, ValueError), (1.5, ValueError), (True, ValueError), ("2", ValueError)]},
        ),
        Name(
            "explain",
            gs.explain,
            dict(input=o["x"], field=o["grid"], grad=o["grad"]),
            ("input", "grid"),
            arrays=True,
            runs=False,
            attributes=("interpolation_mode", "padding_mode", "align_corners", "data_format", "output_mask"),
            extra={
                "field_kind": [("bogus", ValueError), (3, ValueError)],
                "device": [("bogus", ValueError), (3, TypeError)],
                "deterministic": [("x", TypeError), (1, TypeError)],
            },
            message_names={"field": "grid"},
        ),
    ]


NAMES = _names()

# Bad values of each attribute and the error each gets.
ATTRIBUTE_VALUES = {
    "mode": [("bogus", ValueError), (7, ValueError), (1.5, TypeError), (True, TypeError), (None, TypeError)],
    "padding_mode": [("wrap", ValueError), (-1, ValueError), (1.5, TypeError), (False, TypeError), ([0], TypeError)],
    "align_corners": [("yes", TypeError), (1, TypeError), (torch.tensor(True), TypeError), (2.0, TypeError)],
    "data_format": [("NHWC", ValueError), (1, TypeError), (None, TypeError)],
    "displacement_format": [("NCDHW", ValueError), (3, TypeError)],
    "output_mask": [((True,), TypeError), ("ab", TypeError), (1, TypeError), ((1, 0), TypeError)],
    "backend": [("bogus", ValueError), (3, TypeError), (None, TypeError)],
    "deterministic": [("x", TypeError), (1, TypeError)],
}
ATTRIBUTE_VALUES["interpolation_mode"] = ATTRIBUTE_VALUES["mode"]


def _tensor_values(tensor: torch.Tensor, arrays: bool) -> list:
    """Bad values for a tensor argument (``tensor``, the good one): (label, value, errors)."""
    values = [
        ("None", None, (TypeError,)),
        ("list", [[1.0]], (TypeError,)),
        ("str", "x", (TypeError,)),
        ("float", 1.0, (TypeError,)),
        ("4-D", tensor[0], (ValueError,)),
        ("6-D", tensor[None], (ValueError,)),
        ("int32", tensor.to(torch.int32), (TypeError,)),
        ("bool", tensor > 0, (TypeError,)),
        ("complex64", tensor.to(torch.complex64), (TypeError,)),
        ("float64", tensor.double(), (TypeError,)),
        ("meta device", tensor.to("meta"), (ValueError,)),
        ("numpy int64", np.zeros(tuple(tensor.shape), dtype=np.int64), (TypeError,)),
    ]
    if not arrays:
        values.append(("numpy float32", tensor.numpy().copy(), (TypeError,)))
    return values


def _cases():
    for name in NAMES:
        for argument in name.tensors:
            keyword = {"grid": "field"}.get(argument, argument) if name.label == "explain" else argument
            if name.label == "integrate_velocity":
                keyword = "velocity"
            for label, value, errors in _tensor_values(name.good[keyword], name.arrays):
                if argument == "theta" and label in ("4-D", "6-D"):
                    continue  # theta is 3-D: below
                if name.label == "integrate_velocity" and label in ("float64", "meta device"):
                    continue  # its one tensor cannot disagree with another
                if (argument, label) in name.passed_on:
                    continue
                yield pytest.param(name, keyword, value, errors, argument, id=f"{name.label}-{argument}-{label}")
        for attribute in name.attributes:
            for value, error in ATTRIBUTE_VALUES[attribute]:
                yield pytest.param(
                    name, attribute, value, (error,), attribute, id=f"{name.label}-{attribute}-{value!r}"
                )
        for argument, values in name.extra.items():
            for value, error in values:
                yield pytest.param(name, argument, value, (error,), argument, id=f"{name.label}-{argument}-{value!r}")
        if "theta" in name.tensors:
            for label, value in (("2-D", name.good["theta"][0]), ("4 rows", torch.zeros(1, 4, 4))):
                yield pytest.param(name, "theta", value, (ValueError,), "theta", id=f"{name.label}-theta-{label}")


def _snapshot(kwargs: dict) -> dict:
    return {
        key: (value.clone(), value.requires_grad, value.stride())
        for key, value in kwargs.items()
        if isinstance(value, torch.Tensor) and value.device.type != "meta"
    }


def _unchanged(kwargs: dict, before: dict) -> bool:
    return all(
        torch.equal(kwargs[key], clone) and kwargs[key].requires_grad == grad and kwargs[key].stride() == strides
        for key, (clone, grad, strides) in before.items()
    )


@pytest.mark.parametrize("name", NAMES, ids=lambda name: name.label)
def test_every_good_call_works(name):
    """The base of every case below runs: each bad case fails for its one changed argument."""
    name.call(**name.good)


@pytest.mark.parametrize("name, argument, value, errors, named", list(_cases()))
def test_a_bad_argument_gets_a_clear_error(name, argument, value, errors, named):
    kwargs = dict(name.good, **{argument: value})
    before = _snapshot(kwargs)
    with pytest.raises(errors) as raised:
        name.call(**kwargs)
    message = str(raised.value)
    named = name.message_names.get(argument, named)
    assert named in message or argument in message, f"{type(raised.value).__name__} names neither: {message}"
    assert _unchanged(kwargs, before)


OPERATORS = [name for name in NAMES if name.runs]


@pytest.mark.parametrize("name", OPERATORS, ids=lambda name: name.label)
def test_meta_tensors_into_an_operator_say_no_kernel_can_run(name):
    kwargs = {key: value.to("meta") if isinstance(value, torch.Tensor) else value for key, value in name.good.items()}
    with pytest.raises(NotImplementedError, match="meta tensor"):
        name.call(**kwargs)


DIFFERENTIABLE = [name for name in NAMES if not name.arrays and name.label != "F.grid_sample patched (bicubic)"]


@pytest.mark.parametrize("name", DIFFERENTIABLE, ids=lambda name: name.label)
def test_meta_tensors_through_a_differentiable_function_give_the_output_shape(name):
    """The custom ops' fake kernels: meta tensors in, a meta output of the right shape out (no kernel runs)."""
    real = name.call(**name.good)
    kwargs = {key: value.to("meta") if isinstance(value, torch.Tensor) else value for key, value in name.good.items()}
    fake = name.call(**kwargs)
    assert fake.device.type == "meta" and fake.shape == real.shape and fake.dtype == real.dtype


@pytest.mark.parametrize(
    "make, error",
    [
        (lambda: gs.Warp3d(mode="bogus"), ValueError),
        (lambda: gs.Warp3d(padding_mode=1.5), TypeError),
        (lambda: gs.Warp3d(align_corners="yes"), TypeError),
        (lambda: gs.Warp3d(data_format="NHWC"), ValueError),
        (lambda: gs.Warp3d(displacement_format="NCDHW"), ValueError),
        (lambda: gs.AffineWarp3d(padding_mode="bogus"), ValueError),
        (lambda: gs.AffineWarp3d(size=(4, 4)), TypeError),
        (lambda: gs.AffineWarp3d(size=(4, -1, 4)), ValueError),
        (lambda: gs.AffineWarp3d(mode=None), TypeError),
    ],
    ids=[
        "warp-mode",
        "warp-padding",
        "warp-align",
        "warp-layout",
        "warp-displacement",
        "affine-padding",
        "affine-size",
        "affine-negative",
        "affine-mode",
    ],
)
def test_modules_check_their_arguments_when_made(make, error):
    with pytest.raises(error):
        make()


def test_a_module_attribute_set_later_is_checked_then_and_used():
    module = gs.Warp3d()
    with pytest.raises(ValueError, match="padding_mode"):
        module.padding_mode = "wrap"
    module.padding_mode = "zeros"
    volume, displacement = OPERANDS["x"], OPERANDS["displacement"] * 3
    assert torch.equal(module(volume, displacement), gs.warp(volume, displacement, padding_mode="zeros"))


def test_the_matrix_is_large():
    """The matrix covers every public name with many bad values each (the closing note quotes its size)."""
    cases = list(_cases())
    assert len(cases) > 300 and {case.values[0].label for case in cases} == {name.label for name in NAMES}
