"""The declared minimum PyTorch is the true one, and an older torch gets a clear error."""

import subprocess
import sys
from pathlib import Path

import pytest

from gridsampler3d.requirements import MINIMUM_TORCH, check_torch_version

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("version", ["2.9.0", "2.9.1+cu128", "2.10.0a0+git1234", "2.13.0+cpu", "3.0.0"])
def test_supported_versions_pass(version):
    check_torch_version(version)


@pytest.mark.parametrize("version", ["2.8.0+cu121", "2.4.1", "1.13.1"])
def test_older_versions_are_refused_with_the_remedy(version):
    with pytest.raises(
        ImportError,
        match=rf"needs torch>=2\.9 .*found torch {version.replace('+', '[+]')}\. "
        r"Upgrade PyTorch: pip install 'torch>=2\.9'",
    ):
        check_torch_version(version)


def test_pyproject_declares_the_same_minimum():
    tomllib = pytest.importorskip("tomllib")
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert f"torch>={MINIMUM_TORCH[0]}.{MINIMUM_TORCH[1]}" in dependencies


def test_importing_under_an_old_torch_fails_first_and_clearly():
    code = "import torch; torch.__version__ = '2.8.0'; import gridsampler3d"
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: gridsampler3d needs torch>=2.9") and "found torch 2.8.0" in last
    assert "autograd" not in result.stderr  # refused before the custom ops are defined
