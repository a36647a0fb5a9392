"""The warp128 forward exported to ONNX and run in onnxruntime, beside this library and PyTorch.

    python benchmarks/onnx_warp128.py [--repeats 9] [--size 128]

The case is the suite's warp128 (gridsampler3d/bench/suite.py): a single-channel float32
volume warped by a smooth displacement field, bilinear, border padding, align_corners.
``gs.Warp3d`` is exported with ``torch.onnx.export(..., opset_version=20)`` (the default
exporter) and run in onnxruntime's CPU provider with its default threads and with
``intra_op_num_threads`` 1 and 2. Beside it, in the same process and on the same inputs,
at torch threads 1 and 2: ``Warp3d`` on this library's kernels, PyTorch's ``F.grid_sample``
on a grid built beforehand, and PyTorch's whole step (the grid built from the displacement,
then ``F.grid_sample``). Each is the median of ``--repeats`` runs after two warm-up calls.
It needs the ``onnx`` extra.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F

import gridsampler3d as gs
from gridsampler3d.tools.bench.runner import plumbed_grid, plumbed_warp, time_call
from gridsampler3d.tools.bench.suite import build_inputs, select_cases


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=9, help="timed runs of each (default 9)")
    parser.add_argument("--size", type=int, default=128, help="edge of the cubic volume (default 128)")
    args = parser.parse_args(argv)
    import onnxruntime

    (case,) = select_cases("warp128")
    (_, volume, displacement), _ = build_inputs(case, scale=args.size / case.in_size)
    options = (case.mode, case.padding, case.align_corners)
    warp = gs.Warp3d(*options).eval()
    grid = plumbed_grid(displacement, case.align_corners)

    with tempfile.TemporaryDirectory() as directory:
        path = str(Path(directory) / "warp.onnx")
        torch.onnx.export(
            warp, (volume, displacement), path, opset_version=20, verbose=False, input_names=["volume", "displacement"]
        )
        sessions = {}
        for threads in (None, 1, 2):
            settings = onnxruntime.SessionOptions()
            if threads is not None:
                settings.intra_op_num_threads = threads
            label = "default threads" if threads is None else f"intra_op_num_threads={threads}"
            sessions[label] = onnxruntime.InferenceSession(path, settings, providers=["CPUExecutionProvider"])

    feeds = {"volume": volume.numpy(), "displacement": displacement.numpy()}
    with torch.no_grad():
        expected = warp(volume, displacement).numpy()
    print(
        f"warp{args.size} forward: 1x1x{args.size}^3 float32, {case.mode} / {case.padding}, align_corners="
        f"{case.align_corners}; torch {torch.__version__}, onnxruntime {onnxruntime.__version__}; "
        f"median of {args.repeats}"
    )
    for label, session in sessions.items():
        (output,) = session.run(None, feeds)
        seconds = time_call(lambda: session.run(None, feeds), repeats=args.repeats)["median_s"]
        print(
            f"  onnxruntime, {label:24} {seconds * 1e3:8.1f} ms   (max |difference| from Warp3d "
            f"{abs(output - expected).max():.1e})"
        )
    for threads in (1, 2):
        torch.set_num_threads(threads)
        timed = {
            "gs.Warp3d (this library)": lambda: warp(volume, displacement),
            "F.grid_sample on a built grid": lambda: F.grid_sample(volume, grid, *options),
            "PyTorch step (grid, then F.grid_sample)": lambda: plumbed_warp(volume, displacement, *options),
        }
        with torch.no_grad():
            for label, function in timed.items():
                seconds = time_call(function, repeats=args.repeats)["median_s"]
                print(f"  torch threads {threads}, {label:40} {seconds * 1e3:8.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
