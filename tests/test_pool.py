"""Where the CPU engine's parts run: torch's OpenMP team, or the engine's worker threads, with the same bits."""

import os
import select
import signal
import subprocess
import sys
import threading
from pathlib import Path

import numba
import numpy as np
import pytest
import torch
from helpers import make_case

import gridsampler3d as gs
from gridsampler3d.cpu import pool
from gridsampler3d.cpu.slabs import looks_coherent
from gridsampler3d.sampling import Field, Sampling
from gridsampler3d.tools import inputs

# The engine splits even these small calls into parts on its threads, as it splits a large one.
pytestmark = pytest.mark.usefixtures("split_small_calls")

ROOT = Path(__file__).resolve().parents[1]


def _has_team() -> bool:
    try:
        pool.use("team")
    except ValueError:
        return False
    finally:
        pool.use(None)
    return True


HAS_TEAM = _has_team()
ON_A_TEAM = pytest.mark.skipif(not HAS_TEAM, reason="torch's threads are not an OpenMP team here")


@pytest.fixture
def route():
    """Run the parts on a given route inside a test (``route("team")``, ``route("workers")``), chosen anew after."""
    yield pool.use
    pool.use(None)


@pytest.fixture(params=pool.ROUTES)
def path(request, route):
    """Each test on torch's OpenMP team (where there is one) and on the worker threads."""
    if request.param == "team" and not HAS_TEAM:
        pytest.skip("torch's threads are not an OpenMP team here")
    route(request.param)
    return request.param


@numba.njit(nogil=True)
def _mark(marks, failing, part):
    if part == failing:
        raise ValueError("this part fails")
    marks[part] += part + 1


@pytest.mark.parametrize("count", [1, 2, 3])
@pytest.mark.parametrize("tasks", [1, 2, 3, 7])
def test_every_part_runs_once(path, threads, count, tasks):
    """Parts beyond the thread count wait their turn; none runs twice or not at all."""
    threads(count)
    marks = np.zeros(tasks + 1, np.int64)
    # two launches: parts 0 .. tasks - 2 of one (none where tasks is 1), then the last part of another
    pool.run_together([(_mark, (marks, -1), tasks - 1), (_mark, (marks[tasks - 1 :], -1), 1)])
    expected = np.zeros(tasks + 1, np.int64)
    expected[: tasks - 1] = np.arange(1, tasks)
    expected[tasks - 1] = 1
    assert np.array_equal(marks, expected), marks


@pytest.mark.parametrize("failing", [0, 1, 2])
def test_an_error_in_a_part_is_raised_after_every_part_finished(path, threads, failing):
    threads(2)
    marks = np.zeros(3, np.int64)
    with pytest.raises(ValueError, match="this part fails"):
        pool.run_parts(_mark, (marks, failing), 3)
    expected = np.arange(1, 4)
    expected[failing] = 0
    assert np.array_equal(marks, expected), marks


@pytest.mark.parametrize("count", [1, 2, 3])
@pytest.mark.parametrize("fixed, shared", [(1, 5), (2, 9), (0, 4), (3, 1)])
def test_shared_parts_run_once_each_after_a_threads_own(path, threads, count, fixed, shared):
    threads(count)
    order = []  # (thread, launch, part) as the parts start

    def record(marks, launch, part):
        order.append((threading.get_native_id(), launch, part))
        marks[part] += 1

    own, extra = np.zeros(fixed, np.int64), np.zeros(shared, np.int64)
    pool.run_together([(record, (own, "own"), fixed)] if fixed else [], [(record, (extra, "shared"), shared)])
    assert own.tolist() == [1] * fixed and extra.tolist() == [1] * shared, order
    for thread in {thread for thread, _, _ in order}:
        launches = [launch for other, launch, _ in order if other == thread]
        assert launches == sorted(launches), order  # "own" before "shared"
    assert [part for _, launch, part in order if launch == "shared"] == list(range(shared))  # taken in order


def test_a_free_thread_takes_the_shared_parts_while_another_is_busy(path, threads):
    """The thread with a long part of its own leaves every shared part to the other thread."""
    threads(2)
    done = threading.Event()
    taken = []

    def long_part(part):
        assert done.wait(timeout=60), "the shared parts were not taken by the free thread"

    def short_part(part):
        taken.append(threading.get_native_id())
        if len(taken) == 6:
            done.set()

    pool.run_together([(long_part, (), 1)], [(short_part, (), 6)])
    assert len(taken) == 6 and threading.get_native_id() not in taken and len(set(taken)) == 1, taken


@pytest.mark.parametrize("failing", [0, 3])
def test_an_error_in_a_shared_part_is_raised_after_every_part_finished(path, threads, failing):
    threads(2)
    own, extra = np.zeros(2, np.int64), np.zeros(4, np.int64)
    with pytest.raises(ValueError, match="this part fails"):
        pool.run_together([(_mark, (own, -1), 2)], [(_mark, (extra, failing), 4)])
    expected = np.arange(1, 5)
    expected[failing] = 0
    assert np.array_equal(own, [1, 2]) and np.array_equal(extra, expected), (own, extra)


def test_parts_run_where_the_path_says(path, threads):
    """On the team, part 0 on the calling thread and the others on OpenMP threads, the same ones call after call."""
    threads(2)
    where = {}

    def record(calls, part):
        thread = threading.current_thread()
        where[calls, part] = (threading.get_native_id(), thread.name)

    for calls in range(3):
        pool.run_parts(record, (calls,), 2)
    assert all(where[calls, 0][0] == threading.get_native_id() for calls in range(3))
    others = {where[calls, 1] for calls in range(3)}
    assert all(native != threading.get_native_id() for native, _ in others), where
    if path == "team":
        assert len(others) == 1 and not any(name.startswith("gridsampler3d") for _, name in others), where
    else:
        assert all(name.startswith("gridsampler3d") for _, name in others), where


@ON_A_TEAM
@pytest.mark.parametrize("count", [2, 3])
@pytest.mark.parametrize(
    "mode, smooth, data_format, dtype",
    [
        ("bilinear", True, "NCDHW", torch.float32),
        ("bilinear", False, "NCDHW", torch.float32),
        ("nearest", True, "NCDHW", torch.float32),
        ("bilinear", True, "NDHWC", torch.float32),
        ("bicubic", False, "NCDHW", torch.float64),
        ("bilinear", True, "NCDHW", torch.bfloat16),
    ],
    ids=["smooth", "random", "nearest", "channels-last", "bicubic", "bf16"],
)
def test_team_and_workers_give_the_same_bits(route, threads, count, mode, smooth, data_format, dtype):
    """Forward and backward through the engine, its every way of splitting the work, on both routes.

    The tricubic kernels and bfloat16's rounding pass included.
    """
    grad, x, grid = make_case(2, 6, (9, 8, 7), (6, 7, 8), dtype, data_format=data_format)
    if smooth:  # the grid gradient's parts beside dx's
        grid = inputs.warp_grid(2, (6, 7, 8), magnitude=0.1, dtype=dtype)
        assert looks_coherent(Field.grid(grid), 9, Sampling(), 1)
    threads(count)

    def results(wanted):
        route(wanted)
        y = gs.grid_sampler3d(x, grid, mode, "border", data_format=data_format, backend="numba")
        return (y, *gs.grid_sampler3d_backward(grad, x, grid, mode, "border", data_format=data_format, backend="numba"))

    on_team = results("team")
    on_workers = results("workers")
    assert all(torch.equal(a, b) for a, b in zip(on_team, on_workers))


def test_nothing_is_chosen_or_loaded_at_import():
    """Importing the pool chooses no route: the first launch does."""
    code = (
        "import torch; torch.set_num_threads(2); from gridsampler3d.cpu import pool; "
        "assert pool._chosen is None; pool.run_parts(lambda part: None, (), 2); print(pool._chosen[1].name)"
    )
    assert _in_a_new_process(code) in pool.ROUTES


def _in_a_new_process(code, **variables):
    env = {name: value for name, value in os.environ.items() if name != "GRIDSAMPLER3D_OPENMP"}
    env.update(variables)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, check=True
    ).stdout.strip()


@ON_A_TEAM
def test_the_environment_can_keep_the_worker_threads():
    code = "import torch; torch.set_num_threads(2); from gridsampler3d.cpu import pool; print(pool.route())"
    assert _in_a_new_process(code) == "team"
    assert _in_a_new_process(code, GRIDSAMPLER3D_OPENMP="0") == "workers"


def test_a_route_that_is_not_there_is_refused(route):
    with pytest.raises(ValueError, match="route must be one of"):
        route("numba")
    if not HAS_TEAM:
        with pytest.raises(ValueError, match="not an OpenMP team"):
            route("team")


@ON_A_TEAM
def test_a_forked_child_keeps_to_the_worker_threads(route, threads):
    """GNU libgomp waits forever for the parent's team in a forked child: the child must not call it."""
    threads(2)
    route("team")
    marks = np.zeros(2, np.int64)
    pool.run_parts(_mark, (marks, -1), 2)  # the parent's team exists now
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # the child reports through the pipe, never returns into pytest
        try:
            marks[:] = 0
            pool.run_parts(_mark, (marks, -1), 2)
            os.write(write, f"{pool.route()} {marks.tolist()}".encode())
        finally:
            os._exit(0)
    os.close(write)
    ready, _, _ = select.select([read], [], [], 120)  # a hung child fails the test instead of stalling it
    if not ready:
        os.kill(child, signal.SIGKILL)
    with os.fdopen(read) as report:
        said = report.read() if ready else "no answer from the child (hung?)"
    os.waitpid(child, 0)
    assert said == "workers [1, 2]", said
    assert pool.route() == "team"
