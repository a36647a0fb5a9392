"""The benchmark runner's summary statistics (the timed suite itself runs through `gridsampler3d bench`)."""
import math

import pytest

from gridsampler3d.bench.runner import _geomean


def test_geometric_mean_of_ratios():
    assert _geomean([2.0, 8.0]) == pytest.approx(4.0)
    assert _geomean(iter([0.5, 2.0, 1.0])) == pytest.approx(1.0)  # a generator, as the runner passes
    assert math.isnan(_geomean([]))
