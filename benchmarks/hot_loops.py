"""Where the CPU engine's kernels spend their time, loop by loop, from sampled instruction addresses.

    python benchmarks/hot_loops.py --case reg128 --stage backward --threads 1

Runs one benchmark case under ``perf record`` (software clock sampling, which needs
no hardware counters), dumps the machine code of every part kernel that ran, and prints,
per kernel, each hot loop (a backward jump and the code it spans) with its share of the
kernel's samples, its length, and how many of its instructions are hardware gathers or
work on vector registers. A loop with no vector instructions that holds many samples is a
loop that runs scalar: it finds what the static vectorisation guard cannot see, such as a
vectorised loop whose run-time overlap test sends every call to its scalar copy.

Needs ``perf`` and ``objdump`` (binutils) on the PATH. The kernels compile, or load from
the Numba cache, before the timed calls, so the samples are of the runs, not the compile.
"""
from __future__ import annotations

import argparse
import collections
import ctypes
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_CHILD = "GRIDSAMPLER3D_HOT_LOOPS_DIR"
_DUMP_BYTES = 1 << 18  # machine code read from each kernel's entry (within its mapping)


def _mapping_end(address: int) -> int:
    """End of the memory mapping of this process that holds ``address``."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            low, high = (int(bound, 16) for bound in line.split()[0].split("-"))
            if low <= address < high:
                return high
    raise LookupError(f"no mapping holds {address:#x}")


def _kernels_used(run) -> list:
    """The part kernels that ``run()`` launches."""
    from gridsampler3d.cpu import pool

    seen = {}
    launch = pool.run_together

    def recording(launches, shared=()):
        for kernel, _, _ in (*launches, *shared):
            seen[id(kernel)] = kernel
        return launch(launches, shared)

    pool.run_together = recording
    try:
        run()
    finally:
        pool.run_together = launch
    return list(seen.values())


def _child(args, folder: Path) -> None:
    """Run the case's calls (this process runs under perf) and dump the kernels' machine code."""
    import torch

    import gridsampler3d as gs
    from gridsampler3d.bench.suite import build_inputs, select_cases

    torch.set_num_threads(args.threads)
    case = select_cases(args.case)[0]
    (_, _, grid), (grad, x) = build_inputs(case)

    # A displacement case (warp128) runs the fused warp: its "grid" is the displacement.
    forward, backward = ((gs.warp3d, gs.warp3d_backward) if case.grid_kind == "displacement"
                         else (gs.grid_sampler3d, gs.grid_sampler3d_backward))

    def run():
        if args.stage == "backward":
            backward(grad, x, grid, case.mode, case.padding, case.align_corners, backend="numba")
        else:
            forward(x, grid, case.mode, case.padding, case.align_corners, backend="numba")

    kernels = _kernels_used(run)  # also compiles or loads every kernel
    start = time.perf_counter()
    for _ in range(args.calls):
        run()
    print(f"{case.name} {args.stage}, {args.threads} thread(s): "
          f"{1e3 * (time.perf_counter() - start) / args.calls:.1f} ms per call", flush=True)
    with open(folder / "kernels.txt", "w") as listing:
        for kernel in kernels:
            for number, result in enumerate(kernel.overloads.values()):
                address = result.library.get_pointer_to_function(result.fndesc.llvm_func_name)
                size = min(_DUMP_BYTES, _mapping_end(address) - address)
                path = folder / f"code_{address:x}.bin"
                path.write_bytes(ctypes.string_at(address, size))
                listing.write(f"{address:x} {path} {kernel.py_func.__qualname__}#{number}\n")


def _instructions(path: Path, address: int) -> list[tuple[int, str]]:
    listing = subprocess.run(["objdump", "-D", "-b", "binary", "-mi386:x86-64", f"--adjust-vma={address:#x}",
                              str(path)], capture_output=True, text=True, check=True).stdout
    found = []
    for line in listing.splitlines():
        match = re.match(r"\s*([0-9a-f]+):\s+(?:[0-9a-f]{2} )+\s*(.*)", line)
        if match:
            found.append((int(match.group(1), 16), match.group(2).strip()))
    return found


def _report(folder: Path, share: float, listing: float, nested: bool) -> None:
    samples = collections.Counter()
    script = subprocess.run(["perf", "script", "-i", str(folder / "perf.data"), "-F", "ip"], capture_output=True,
                            text=True, check=True).stdout
    for line in script.split():
        samples[int(line, 16)] += 1
    total = sum(samples.values())
    kernels = sorted((int(address, 16), Path(path), name) for address, path, name
                     in (line.split() for line in (folder / "kernels.txt").read_text().splitlines()))
    for index, (address, path, name) in enumerate(kernels):
        end = kernels[index + 1][0] if index + 1 < len(kernels) else address + path.stat().st_size
        end = min(end, address + path.stat().st_size)
        mine = {ip: count for ip, count in samples.items() if address <= ip < end}
        count = sum(mine.values())
        if count < 0.01 * total:
            continue
        print(f"\n{name}: {count} samples, {100 * count / total:.1f}% of the process")
        code = _instructions(path, address)
        loops = set()
        for at, text in code:
            jump = re.match(r"j\w+\s+0x([0-9a-f]+)", text)
            if jump and address <= int(jump.group(1), 16) < at and at < end:
                loops.add((int(jump.group(1), 16), at))
        rows = []
        for first, last in sorted(loops):
            held = sum(value for ip, value in mine.items() if first <= ip <= last)
            if held >= share * count:
                body = [text for at, text in code if first <= at <= last]
                rows.append((first, last, held, body))
        for first, last, held, body in rows:
            # Report the innermost loops (with --nested, also the loops around them whose
            # samples their inner loops do not already hold).
            inner = [r for r in rows if r[0] >= first and r[1] <= last and (r[0], r[1]) != (first, last)]
            if inner and (not nested or any(r[2] >= 0.9 * held for r in inner)):
                continue
            gathers = sum("gather" in text for text in body)
            vector = sum(bool(re.search(r"%[yz]mm", text)) for text in body)
            print(f"  +{first - address:#07x}..+{last - address:#07x} {100 * held / count:5.1f}%  "
                  f"{len(body):4d} instructions, {vector:3d} on vector registers, {gathers:2d} gathers"
                  + ("  (scalar)" if vector == 0 else ""))
            if held >= listing * count:
                print("\n".join(f"      {text}" for text in body))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", default="reg128", help="a benchmark case name")
    parser.add_argument("--stage", choices=("forward", "backward"), default="backward")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--calls", type=int, default=20, help="timed calls to sample")
    parser.add_argument("--share", type=float, default=0.02, help="smallest share of a kernel's samples to list")
    parser.add_argument("--nested", action="store_true", help="also list the loops around the innermost ones")
    parser.add_argument("--listing", type=float, default=2.0,
                        help="also print the instructions of loops holding at least this share (default: none)")
    args = parser.parse_args()
    if os.environ.get(_CHILD):
        _child(args, Path(os.environ[_CHILD]))
        return
    for tool in ("perf", "objdump"):
        if shutil.which(tool) is None:
            sys.exit(f"hot_loops: needs {tool} on the PATH")
    with tempfile.TemporaryDirectory(prefix="hot_loops_") as folder:
        command = ["perf", "record", "-q", "-e", "cpu-clock", "-F", "4000", "-o", f"{folder}/perf.data",
                   sys.executable, __file__, *sys.argv[1:]]
        subprocess.run(command, env={**os.environ, _CHILD: folder}, check=True)
        _report(Path(folder), args.share, args.listing, args.nested)


if __name__ == "__main__":
    main()
