"""What a call pays in Python above its kernels: the calls of one eager forward and backward of each
differentiable function, counted by cProfile (benchmarks/call_counts.py), stay within the front door's budget.

The counts do not depend on the machine's speed; they do on torch's own autograd code (about 40 of them), so the
budget holds for the torch the project pins.
"""

import pytest
from helpers import benchmark_script

BUDGET = 250  # calls per forward and backward of a 16³ case, each kind of field
SPREAD = 1.10  # the most / the least, over the kinds: the same front door for each


@pytest.fixture(scope="module")
def counts():
    call_counts = benchmark_script("call_counts")
    return {name: call_counts.count(step).total_calls for name, step in call_counts._cases(16, 2).items()}


def test_every_kind_of_field_costs_at_most_the_budget(counts):
    assert all(calls <= BUDGET for calls in counts.values()), counts


def test_every_kind_of_field_costs_about_the_same(counts):
    assert max(counts.values()) <= SPREAD * min(counts.values()), counts
