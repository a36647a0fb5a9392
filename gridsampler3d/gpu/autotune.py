"""Launch-shape tuning of the Triton kernels: the fastest of a few shapes, timed once per key on the GPU.

The kernels' speed depends on how many output points (or voxels) a program takes and on
its number of warps, and the best pair depends on the dtype, the layout and the channel
count. On a CUDA device, the first launch for each key (kernel, dtype, layout, channel
count rounded up to a power of two) times every candidate shape on the actual operands
and keeps the fastest for the rest of the process. Candidates only change how the work is
split, never what is computed: the engine tunes only launches whose results do not
depend on the split (``tests/test_gpu.py`` checks this for every candidate), so tuning
never moves a bit of the deterministic mode.

Under Triton's interpreter, with ``GRIDSAMPLER3D_AUTOTUNE=0``, or while a CUDA graph is
being captured, the first candidate (the engine's default shape) is used untimed.
"""

from __future__ import annotations

import os
import statistics
import threading
from typing import Callable, Hashable, Sequence, TypeVar

import torch

__all__ = ["Tuner", "TUNER", "enabled", "ENVIRONMENT_VARIABLE"]

ENVIRONMENT_VARIABLE = "GRIDSAMPLER3D_AUTOTUNE"
Candidate = TypeVar("Candidate")


def enabled(device: torch.device) -> bool:
    """Whether launches on ``device`` are tuned: CUDA devices, unless switched off by the
    environment, and not while a CUDA graph is being captured (timing needs to synchronise)."""
    if device.type != "cuda" or os.environ.get(ENVIRONMENT_VARIABLE, "1") in ("", "0"):
        return False
    return not (torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())


def _cuda_seconds(run: Callable[[], None], repeats: int) -> float:
    """Median device time of ``repeats`` runs of ``run`` after one untimed run (which compiles it)."""
    run()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


class Tuner:
    """Chooses, and remembers per key, the fastest of a launch's candidate shapes.

    ``timer(run, repeats)`` returns the seconds one run of ``run`` takes (default: CUDA
    events, median of ``repeats`` after a warm-up run).
    """

    def __init__(self, timer: Callable[[Callable[[], None], int], float] = _cuda_seconds, repeats: int = 5):
        self._timer = timer
        self._repeats = repeats
        self._chosen: dict = {}
        self._timings: dict = {}
        self._lock = threading.Lock()

    def choose(
        self, key: Hashable, candidates: Sequence[Candidate], launch: Callable[[Candidate], None], tune: bool = True
    ) -> Candidate:
        """The candidate to launch for ``key``: timed once per key when ``tune``; else ``candidates[0]``.

        ``launch(candidate)`` runs the kernel with that shape on the real operands; it
        must leave them ready to be launched again (for instance re-zero an output that
        is accumulated into). The caller then launches the chosen candidate itself.
        """
        if not tune or len(candidates) == 1:
            return candidates[0]
        with self._lock:
            if key in self._chosen:
                return self._chosen[key]
            seconds = [
                self._timer(lambda candidate=candidate: launch(candidate), self._repeats) for candidate in candidates
            ]
            best = candidates[min(range(len(candidates)), key=seconds.__getitem__)]
            self._chosen[key] = best
            self._timings[key] = list(zip(candidates, seconds))
            return best

    def report(self) -> list[dict]:
        """What was tuned so far: per key, each candidate's time in ms, and the one chosen."""
        with self._lock:
            return [
                {
                    "key": [str(part) for part in key],
                    "chosen": self._chosen[key],
                    "candidates": [
                        {"shape": candidate, "ms": round(seconds * 1e3, 4)} for candidate, seconds in self._timings[key]
                    ],
                }
                for key in self._chosen
            ]

    def clear(self) -> None:
        """Forget every choice (they are made again at the next launch of each key)."""
        with self._lock:
            self._chosen.clear()
            self._timings.clear()


TUNER = Tuner()
