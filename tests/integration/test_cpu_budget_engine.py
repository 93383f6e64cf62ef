"""Without --kv-cache-memory on a CPU, kveval sizes the KV budget itself (real engine)."""
from __future__ import annotations

import pytest

import kveval
from tests.support.quiet import Quiet

pytestmark = pytest.mark.engine


def test_cpu_run_without_a_budget_gets_one_sized_to_the_run(tmp_path, default_model_dir):
    run = kveval.compare(kv=["auto"], max_model_len=[512], out=tmp_path / "r", enforce_eager=True, suite="quick",
                         counts={"short_256": 1, "short_512": 0, "ctx_1k": 0, "ctx_pct": 0, "over": 0},
                         phases=["generation"], diagnose=False, progress=Quiet())
    options = run.manifest["options"]
    assert options["kv_cache_memory_bytes"] == 64 * 2 ** 20  # 1 request of 512 tokens is below the 64 MiB floor
    assert "chosen by kveval for this CPU" in options["kv_budget_note"]
    facts = run.cell("auto", 512)
    assert facts["started"] is True
    assert facts["capacity"]["kv_pool_tokens"] == (64 * 2 ** 20 // (128 * 23_040)) * 128   # 2,816, not most of RAM
    assert "chosen by kveval for this CPU" in run.review_path.read_text()
