"""The reads of PyTorch's non-public API (gridsampler3d/torch_hooks.py): each hook works with this torch, each
fallback is correct, and no other module reads torch's private names."""

import re
from pathlib import Path

import pytest
import tomllib
import torch

import gridsampler3d as gs
from gridsampler3d import torch_hooks

ROOT = Path(__file__).resolve().parents[1]


def _leaves():
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(2, 2, 4, 5, 3, generator=generator, dtype=torch.float64)
    grid = torch.rand(2, 3, 4, 2, 3, generator=generator, dtype=torch.float64) * 2.2 - 1.1
    return x, grid


def test_every_hook_finds_what_it_reads_in_the_tested_releases():
    assert torch_hooks.missing_hooks() == [] or not _tested_release(), torch_hooks.missing_hooks()


def _tested_release() -> bool:
    version = torch.__version__.split("+")[0]
    return version in torch_hooks.TESTED_TORCH


def test_the_tested_range_starts_at_the_lowest_torch_pyproject_admits():
    requirements = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    lowest = next(re.match(r"torch>=([\d.]+)", line).group(1) for line in requirements if line.startswith("torch>="))
    assert torch_hooks.TESTED_TORCH[0].startswith(lowest + ".") or torch_hooks.TESTED_TORCH[0] == lowest


def test_no_other_module_reads_torchs_private_names():
    private = re.compile(r"torch\._[A-Za-z]|\._internal\b|\._destroy\b|torch\.utils\._|_functorch|_python_dispatch")
    readers = [
        path.relative_to(ROOT).as_posix()
        for path in sorted((ROOT / "gridsampler3d").rglob("*.py"))
        if path.name != "torch_hooks.py" and private.search(path.read_text())
    ]
    assert not readers, readers


def test_functorch_wrapped_tells_vmapped_tensors(monkeypatch):
    seen = []

    def probe(tensor):
        seen.append(torch_hooks.functorch_wrapped(tensor))
        return tensor * 2

    torch.func.vmap(probe)(torch.ones(3, 2))
    assert seen == [True] and not torch_hooks.functorch_wrapped(torch.ones(2))
    # vmap over the batch gives the same result as the loop, through the custom ops
    x, grid = _leaves()
    looped = torch.stack([gs.grid_sample(x[i : i + 1], grid[i : i + 1])[0] for i in range(2)])
    assert torch.equal(torch.func.vmap(lambda a, b: gs.grid_sample(a[None], b[None])[0])(x, grid), looped)
    # Without the private test every tensor counts as wrapped: the custom ops, the same result.
    monkeypatch.setattr(torch_hooks, "_is_functorch_wrapped", None)
    assert torch_hooks.functorch_wrapped(torch.ones(2))
    assert torch.equal(gs.grid_sample(x, grid), torch.nn.functional.grid_sample(x, grid, align_corners=False))


def test_dispatch_mode_active_tells_a_dispatch_mode(monkeypatch):
    from torch.utils._python_dispatch import TorchDispatchMode

    class Counting(TorchDispatchMode):
        calls = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Counting.calls += 1
            return func(*args, **(kwargs or {}))

    assert not torch_hooks.dispatch_mode_active()
    x, grid = _leaves()
    with Counting():
        assert torch_hooks.dispatch_mode_active()
        y = gs.grid_sample(x, grid)
    assert Counting.calls > 0  # the custom op went through the mode
    assert torch.equal(y, gs.grid_sample(x, grid))
    monkeypatch.setattr(torch_hooks, "_dispatch_stack_depth", None)
    assert torch_hooks.dispatch_mode_active()


@pytest.mark.filterwarnings("ignore:Warning only once for all operators:UserWarning")
def test_remove_library_brings_pytorchs_kernels_back(monkeypatch):
    x, grid = _leaves()
    calls = []
    monkeypatch.setattr(
        gs.api, "grid_sampler3d", lambda *args, _run=gs.api.grid_sampler3d: calls.append(1) or _run(*args)
    )
    with gs.patched():
        torch.nn.functional.grid_sample(x, grid, align_corners=False)
    assert calls == [1]
    torch.nn.functional.grid_sample(x, grid, align_corners=False)
    assert calls == [1] and not gs.is_patched()  # PyTorch's own kernel ran
    monkeypatch.setattr(torch_hooks, "_library_destroy", None)
    with pytest.raises(RuntimeError, match="new process"):
        torch_hooks.remove_library(torch.library.Library("aten", "IMPL"))


_SEEN = []


class _Probe(torch.nn.Module):
    """Records what the hooks say while an export traces it (in a list of the module's: an exporter may trace a
    copy of the model)."""

    def forward(self, x):
        _SEEN.append((torch_hooks.onnx_export_in_progress(), torch_hooks.requested_opset()))
        return x + 1


@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
def test_the_onnx_hooks_see_an_export_and_its_opset(tmp_path, dynamo, monkeypatch):
    pytest.importorskip("onnx")
    if dynamo:
        pytest.importorskip("onnxscript")
    probe = _Probe().eval()
    _SEEN.clear()
    options = {"dynamo": dynamo} if "dynamo" in torch.onnx.export.__code__.co_varnames else {}
    if dynamo and not options:
        pytest.skip("this torch has no dynamo exporter in torch.onnx.export")
    torch.onnx.export(probe, (torch.ones(2),), str(tmp_path / "probe.onnx"), opset_version=20, **options)
    assert _SEEN and all(seen == (True, 20) for seen in _SEEN), _SEEN
    assert probe(torch.ones(2)) is not None and _SEEN[-1] == (False, None)
    # Without the exporters' flags: the public test, which the TorchScript exporter sets.
    monkeypatch.setattr(torch_hooks, "_dynamo_flags", None)
    monkeypatch.setattr(torch_hooks, "_torchscript_globals", None)
    assert not torch_hooks.onnx_export_in_progress()
