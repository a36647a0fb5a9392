"""What a first call waits for: Numba compiling the engine's kernels, said as it happens and timed apart.

A mode's first call compiles its kernels (seconds each) unless Numba's disk cache holds
them (docs/cpu.md, "Compilation"). The commands that time or run calls (``run``,
``check``, ``demo``, ``bench``) wrap their work in :func:`reporting_compiles`, so a user
sees which kernel is compiling while it does, and no figure read as speed includes it.

Numba broadcasts a ``"numba:compile"`` event around every compile its disk cache could not
serve (``numba.core.event``, Numba's documented event API). A kernel's compile nests its
helpers' compiles; only the outermost one is named and timed. Where the API is missing, the
report stays empty and says so.
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections.abc import Callable, Iterator

__all__ = ["CompileReport", "label", "reporting_compiles"]


def label(kernel, stage: str, sampling, field, channels_last: bool, exact_remainder: bool) -> None:
    """Name what ``kernel`` (a dispatcher a kernel factory made) computes, for the compile messages: the stage, the
    sampling rule, the kind of field, the layout, and whether it is the exact-remainder rerun."""
    interpolation = {"BILINEAR": "trilinear", "NEAREST": "nearest", "BICUBIC": "tricubic"}[sampling.interpolation.name]
    words = [stage, interpolation, sampling.padding.name.lower()]
    if sampling.align_corners:
        words.append("align_corners")
    words += [field.name.lower().replace("_", "+"), "channels-last" if channels_last else "NCDHW"]
    if exact_remainder:
        words.append("(exact remainder)")
    kernel.py_func.compile_label = " ".join(words)


def _described(dispatcher, arguments) -> str:
    """A compile's name: the kernel's label (:func:`label`), or its module and name; then the dtype of its first
    floating array argument."""
    function = dispatcher.py_func
    name = getattr(function, "compile_label", None)
    if name is None:
        module = function.__module__.removeprefix("gridsampler3d.")
        name = f"{module}.{function.__qualname__}".replace("<locals>.", "")
    for argument in arguments:
        found = re.search(r"array\((float\d+)", str(argument))
        if found:
            return f"{name} {found[1]}"
    return name


class CompileReport:
    """The compiles seen while :func:`reporting_compiles` was active: ``names`` (the outermost, in order),
    ``seconds`` (their wall time, summed), and ``watched`` (False where Numba offers no event API)."""

    def __init__(self, echo: Callable[[str], None] | None, expected: int | None = None):
        self.names: list[str] = []
        self.expected = expected  # how many the caller expects, for "compiling 3/12"
        self.seconds = 0.0
        self.watched = True
        self._echo = echo
        self._lock = threading.Lock()
        self._local = threading.local()

    def started(self, name: str) -> None:
        depth = getattr(self._local, "depth", 0)
        self._local.depth = depth + 1
        if depth == 0:
            self._local.start = time.perf_counter()
            with self._lock:
                self.names.append(name)
            if self._echo is not None:
                count = f"{len(self.names)}/{self.expected}" if self.expected else f"{len(self.names)}"
                self._echo(f"compiling {count}: {name} (once: later runs load it from the disk cache)")

    def ended(self) -> None:
        self._local.depth -= 1
        if self._local.depth == 0:
            with self._lock:
                self.seconds += time.perf_counter() - self._local.start

    def summary(self) -> str:
        """One line: how many kernels compiled and for how long, or that none did."""
        if not self.watched:
            return "compile time not measured (this Numba has no event API)"
        if not self.names:
            return "no kernel compiled (all loaded from the disk cache or compiled earlier in this process)"
        kernels = "kernel" if len(self.names) == 1 else "kernels"
        return f"compiled {len(self.names)} {kernels} once in {self.seconds:.1f} s (cached on disk for later runs)"


@contextlib.contextmanager
def reporting_compiles(
    echo: Callable[[str], None] | None = None, expected: int | None = None
) -> Iterator[CompileReport]:
    """Within the block, name each kernel Numba compiles through ``echo`` (if given) as it starts, counted
    (out of ``expected`` where the caller knows it), and time it.

    Yields a :class:`CompileReport`, complete when the block ends.
    """
    report = CompileReport(echo, expected)
    try:
        from numba.core import event
    except ImportError:
        report.watched = False
        yield report
        return

    class Listener(event.Listener):
        def on_start(self, ev):
            report.started(_described(ev.data["dispatcher"], ev.data.get("args", ())))

        def on_end(self, ev):
            report.ended()

    with event.install_listener("numba:compile", Listener()):
        yield report
