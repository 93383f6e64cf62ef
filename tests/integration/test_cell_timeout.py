"""A real cell process that overruns --cell-timeout is stopped, and the stop is stored as a finding."""
from __future__ import annotations

import pytest

import kveval
from tests.support.quiet import Quiet

pytestmark = pytest.mark.engine


def test_a_hung_cell_is_stopped_and_recorded(tmp_path, default_model_dir, monkeypatch):
    # 3 s is less than importing vLLM takes, so a cold child is always stopped before its engine is up. A
    # forked one (run/fork_server.py, the CPU default) skips the import and may start its engine in 3 s:
    # this test starts its cell cold (the forked timeout: tests/unit/test_fork_server.py).
    monkeypatch.setenv("KVEVAL_FORK_CELLS", "0")
    # Generation only and no tasks: the cell never gets past its start, so writing six tasks' data into
    # the run first would be CI time for nothing.
    run = kveval.compare(kv=["auto"], max_model_len=[512], out=tmp_path / "r", kv_cache_memory="40MiB",
                         enforce_eager=True, suite="quick", cell_timeout=3, progress=Quiet(),
                         phases=("generation",), tasks=["none"])
    facts = run.cell("auto", 512)
    assert facts.started is False
    assert facts.process.timed_out is True
    assert "timeout of 3 s" in facts.failure.message
    assert run.verdict.status == "INCONCLUSIVE"
    assert "timeout of 3 s" in run.review_path.read_text()
