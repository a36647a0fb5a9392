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
import threading
import time
from collections.abc import Callable, Iterator

__all__ = ["CompileReport", "reporting_compiles"]


class CompileReport:
    """The compiles seen while :func:`reporting_compiles` was active: ``names`` (the outermost, in order),
    ``seconds`` (their wall time, summed), and ``watched`` (False where Numba offers no event API)."""

    def __init__(self, echo: Callable[[str], None] | None):
        self.names: list[str] = []
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
                self._echo(f"compiling {name} (once: later runs load it from the disk cache)")

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
def reporting_compiles(echo: Callable[[str], None] | None = None) -> Iterator[CompileReport]:
    """Within the block, name each kernel Numba compiles through ``echo`` (if given) as it starts, and time it.

    Yields a :class:`CompileReport`, complete when the block ends.
    """
    report = CompileReport(echo)
    try:
        from numba.core import event
    except ImportError:
        report.watched = False
        yield report
        return

    class Listener(event.Listener):
        def on_start(self, ev):
            function = ev.data["dispatcher"].py_func
            module = function.__module__.removeprefix("gridsampler3d.")
            report.started(f"{module}.{function.__qualname__}".replace("<locals>.", ""))

        def on_end(self, ev):
            report.ended()

    with event.install_listener("numba:compile", Listener()):
        yield report
