"""MONAI's affine transforms three ways: MONAI's own, MONAI's under the patch, and with the sampling fused.

    python benchmarks/monai_affine.py --threads 1 --repeats 7

Three transforms, as the issue that asked for the fused affine field measured them:
``Affine`` (rotate + scale, bilinear, border) on a 1 x 160 x 192 x 224 image, and
``RandAffine`` (bilinear, zeros) on a 1 x 128³ image and on 4 images of 96³ one after
another. Each is timed as MONAI's transform on PyTorch's kernels, the same transform
under ``gridsampler3d.patched()`` (MONAI builds its grid, this library samples), and
``gridsampler3d.monai``'s drop-ins (MONAI's transforms, whose grid is not made and whose
sampling runs on the fused affine field), back to back in each repeat, after warm-up; the
random transforms' three see the same draws (the same seed before each call). A fourth
row times the dictionary version on an image and its label (bilinear and nearest). It prints the median
times and the largest difference between the fused result and MONAI's, relative to the
image's scale (for a label, sampled nearest, how many voxels differ: a position within
float32 rounding of a half voxel may round the other way).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings

import torch

import gridsampler3d
from gridsampler3d import monai as gs_monai


def _cases():
    """(label, MONAI's transform, the fused one, the images, a seed before each call or None)."""
    from monai.transforms import Affine, RandAffine, RandAffined

    generator = torch.Generator().manual_seed(0)
    rotate = dict(rotate_params=(0.2, 0.1, -0.15), scale_params=(1.1, 0.95, 1.05), padding_mode="border")
    random = dict(
        prob=1.0,
        rotate_range=(0.3, 0.3, 0.3),
        scale_range=(0.1, 0.1, 0.1),
        translate_range=(5, 5, 5),
        padding_mode="zeros",
    )
    keyed = dict(keys=["image", "label"], mode=("bilinear", "nearest"))
    mri = [torch.rand(1, 160, 192, 224, generator=generator)]
    cube = [torch.rand(1, 128, 128, 128, generator=generator)]
    batch = [torch.rand(1, 96, 96, 96, generator=generator) for _ in range(4)]
    return [
        (
            "Affine (rotate + scale), bilinear border, 1 x 160 x 192 x 224",
            Affine(**rotate, image_only=True),
            gs_monai.Affine(**rotate, image_only=True),
            mri,
            None,
        ),
        ("RandAffine, bilinear zeros, 1 x 128^3", RandAffine(**random), gs_monai.RandAffine(**random), cube, 1),
        ("RandAffine, bilinear zeros, 4 x 96^3", RandAffine(**random), gs_monai.RandAffine(**random), batch, 2),
        (
            "RandAffined, image (bilinear) + label (nearest), zeros, 1 x 128^3",
            RandAffined(**keyed, **random),
            gs_monai.RandAffined(**keyed, **random),
            [{"image": cube[0], "label": (cube[0] > 0.5).float()}],
            3,
        ),
    ]


def _run(transform, images, seed):
    """The transform over the images (reseeded first where ``seed`` is given); its outputs as plain tensors."""
    if seed is not None:
        transform.set_random_state(seed)
    outputs = [transform(image) for image in images]
    pairs = [pair for output in outputs for pair in (output.items() if isinstance(output, dict) else [("", output)])]
    return [(key, output.as_tensor() if hasattr(output, "as_tensor") else output) for key, output in pairs]


def _timed(function) -> tuple[float, list]:
    start = time.perf_counter()
    result = function()
    return time.perf_counter() - start, result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1, help="torch's threads (default 1, a DataLoader worker's)")
    parser.add_argument("--repeats", type=int, default=7, help="timed triples (default 7)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed calls of each first (default 1)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", category=UserWarning, module="monai")
    warnings.filterwarnings("ignore", message="Warning only once for all operators")
    print(
        f"MONAI {__import__('monai').__version__}, torch {torch.__version__}, {torch.get_num_threads()} thread(s), "
        f"float32, medians of {args.repeats} repeats"
    )
    print("| MONAI transform | PyTorch | patched | fused | speed-up patched | speed-up fused | fused vs MONAI |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for label, theirs, fused, images, seed in _cases():
        runs = {
            "torch": lambda: _run(theirs, images, seed),
            "fused": lambda: _run(fused, images, seed),
        }

        def patched():
            with gridsampler3d.patched():
                return _run(theirs, images, seed)  # noqa: B023

        runs["patched"] = patched
        for _ in range(args.warmup):
            for run in runs.values():
                run()
        times = {name: [] for name in runs}
        results = {}
        for _ in range(args.repeats):
            for name, run in runs.items():
                elapsed, results[name] = _timed(run)
                times[name].append(elapsed)
        medians = {name: statistics.median(values) for name, values in times.items()}
        pairs = list(zip(results["fused"], results["torch"]))
        images = [(ours, gold) for (key, ours), (_, gold) in pairs if key != "label"]
        scale = max(float(gold.abs().max()) for _, gold in images)
        error = max(float((ours - gold).abs().max()) for ours, gold in images) / scale
        differing = sum(int((ours != gold).sum()) for (key, ours), (_, gold) in pairs if key == "label")
        labels = (
            f"; label: {differing} voxels differ (nearest at a tie)" if any(k == "label" for (k, _), _ in pairs) else ""
        )
        print(
            f"| {label} | {medians['torch'] * 1e3:.0f} ms | {medians['patched'] * 1e3:.0f} ms | "
            f"{medians['fused'] * 1e3:.0f} ms | {medians['torch'] / medians['patched']:.2f}x | "
            f"{medians['torch'] / medians['fused']:.2f}x | {error:.1e}{labels} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
