"""Engine runs that more than one integration test reads (each is minutes of CI on a 2-core CPU)."""
from __future__ import annotations

import pytest

import kveval
from tests.support.quiet import Quiet

# Two `auto` cells, generation only, on the budget kveval chooses for a CPU: the evidence test reads
# its diff and scan, and the planted-degradation test compares its planted model's auto tokens with
# these. (The Ray test runs the same matrix on the fake engine, in a fixture of its own.)
TWO_AUTO_CELLS = dict(kv=["auto"], max_model_len=[512, 1024], enforce_eager=True, suite="quick",
                      phases=("generation",),
                      counts={"short_256": 2, "short_512": 0, "probe": 0, "ctx_1k": 0, "ctx_pct": 0, "over": 0})


@pytest.fixture(scope="session")
def two_auto_cells(tmp_path_factory, default_model_dir):
    return kveval.compare(out=tmp_path_factory.mktemp("two-auto") / "r", progress=Quiet(), **TWO_AUTO_CELLS)
