"""The CPU engine in forked and spawned processes and under concurrent Python threads, on its own threads.

Each check runs tests/process_checks.py in its own process under a timeout: a crash, a
hang or a differing bit fails the test without taking the suite down.
"""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHECKS = ["fork", "spawn", "threads", "thread-count"]
# Long enough for a cold start that compiles the float64 kernels on a busy machine.
TIMEOUT_S = 300


def _run_check(*args):
    env = dict(os.environ)
    # The package under test is this checkout's, also where another copy is installed.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    command = [sys.executable, str(ROOT / "tests" / "process_checks.py"), *args]
    # A session of its own, so that a hung check's workers are killed with it.
    process = subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        output, _ = process.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        pytest.fail(f"{' '.join(args)}: no result after {TIMEOUT_S} s (hung?)\n{output[-4000:]}")
    assert process.returncode == 0 and "ok:" in output, (
        f"{' '.join(args)}: exit status {process.returncode}\n{output[-4000:]}"
    )
    return output


@pytest.mark.slow
@pytest.mark.parametrize("check", CHECKS)
def test_engine_across_processes_and_threads(check):
    """Fork (DataLoader workers), spawn, 4 concurrent threads, changing thread counts: all bit for bit."""
    _run_check(check)
