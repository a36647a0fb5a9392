"""The oldest PyTorch this package runs on, checked when the package is imported.

The whole test suite passes on torch 2.9.1 and 2.13.0. The custom ops
(``torch.library.custom_op`` with ``register_fake`` and ``register_autograd``) first
appeared in 2.4, but releases before 2.9 fail elsewhere: their schema inference, Dynamo and
``torch.export`` reject what the custom ops and the ONNX path do. An older torch would fail
deep inside ``autograd``, so the version is checked before anything else.
"""

from __future__ import annotations

import re

import torch

__all__ = ["MINIMUM_TORCH", "check_torch_version"]

MINIMUM_TORCH = (2, 9)


def check_torch_version(version: str) -> None:
    """Raise ImportError, naming the remedy, when ``version`` (``torch.__version__``) is below MINIMUM_TORCH."""
    match = re.match(r"(\d+)\.(\d+)", version)
    if match is None:  # a build with an unusual version string: let it try
        return
    if tuple(int(part) for part in match.groups()) < MINIMUM_TORCH:
        minimum = ".".join(map(str, MINIMUM_TORCH))
        raise ImportError(
            f"gridsampler3d needs torch>={minimum} (the oldest release its tests pass on); "
            f"found torch {version}. Upgrade PyTorch: pip install 'torch>={minimum}'"
        )


check_torch_version(torch.__version__)
