"""Throughput sweep: levels, the long prompt, and the aggregation into requests/s, tokens/s and latency."""
from __future__ import annotations

import pytest

from kveval.analysis.throughput import throughput_table
from kveval.worker.phases.throughput import levels_for
from tests.support.constructed import complete_cell
from tests.support.evidence import typed_cells


def test_levels_add_the_cells_own_maximum_and_stay_below_max_num_seqs():
    assert levels_for([1, 4, 16, 64], 22.75) == [1, 4, 16, 22, 64]
    assert levels_for([1, 4, 16, 64], 0.4) == [1, 4, 16, 64]
    assert levels_for([1, 512], 938.3) == [1, 256]


def _run(level, wall, ttfts, itls, tokens=16):
    return {"concurrency": level, "accepted": True, "error": None, "wall_seconds": wall,
            "requests": [{"output_tokens": tokens, "ttft_s": t, "itl_s": i, "preemptions": 0} for t, i in zip(ttfts, itls)]}


def _cell(kv, runs, max_concurrency, started=False):
    return complete_cell({"cell": f"{kv}-1024", "kv_spec": kv, "max_model_len": 1024, "started": started,
                          "phases": {"throughput": {"prompt_tokens": 256, "max_tokens": 16, "levels": [1, 4],
                                                    "max_concurrency": max_concurrency, "runs": runs}}})


def test_aggregation_and_ratio_against_the_baseline():
    cells = {"auto-1024": _cell("auto", [_run(1, 2.0, [0.5], [0.1]), _run(4, 8.0, [0.5, 1, 2, 4], [0.1] * 4)], 1.75),
             "fp8-1024": _cell("fp8", [_run(1, 2.0, [0.5], [0.1]), _run(4, 4.0, [0.5] * 4, [0.2] * 4)], 3.5)}
    table = throughput_table(typed_cells(cells))
    auto4 = table[(table.cell == "auto-1024") & (table.concurrency == 4)].iloc[0]
    assert auto4.requests_per_s == 0.5 and auto4.output_tok_s == 8.0
    assert auto4.ttft_ms_p50 == pytest.approx(1500.0) and auto4.ttft_ms_p99 == pytest.approx(3940.0)
    fp8 = table[table.cell == "fp8-1024"].set_index("concurrency")
    assert fp8.loc[1].output_tok_s_vs_baseline == 1.0 and fp8.loc[4].output_tok_s_vs_baseline == 2.0
    assert fp8.loc[4].itl_ms_p50 == pytest.approx(200.0)


def test_review_says_where_fp8_outruns_auto():
    from tests.support.constructed import manifest_for
    from tests.support.review import review_of

    cells = {"auto-1024": _cell("auto", [_run(1, 2.0, [0.5], [0.1]), _run(4, 8.0, [0.5] * 4, [0.1] * 4)], 1.75,
                                started=True),
             "fp8-1024": _cell("fp8", [_run(1, 2.0, [0.5], [0.1]), _run(4, 4.0, [0.5] * 4, [0.2] * 4)], 3.5,
                               started=True)}
    review = review_of(manifest_for(cells), [], cells)
    assert "## Throughput under concurrency" in review
    assert "- **fp8-1024**: ahead of `auto` at concurrency 4 (its pool holds 3.5 requests of max_model_len)." in review


def test_capacity_and_throughput_figures_are_written_from_evidence_rows(tmp_path):
    from kveval.files import schema
    from kveval.render.capacity_plots import capacity_plot, throughput_plot

    def typed(model, rows):  # evidence rows with the figures a test leaves out unknown (None)
        return [model.model_validate({**dict.fromkeys(model.model_fields), **row}) for row in rows]

    rows = [{"cell": "auto-1024", "kv_spec": "auto", "max_model_len": 1024, "predicted_tokens": 1792,
             "measured_tokens": 1792, "started": True},
            {"cell": "auto-2048", "kv_spec": "auto", "max_model_len": 2048, "predicted_tokens": 1792,
             "measured_tokens": None, "started": False}]
    assert capacity_plot(typed(schema.CapacityRow, rows), tmp_path / "c.png").read_bytes().startswith(b"\x89PNG")
    unpredicted = typed(schema.CapacityRow, [{**rows[0], "predicted_tokens": None}])
    assert capacity_plot(unpredicted, tmp_path / "none.png") is None
    sweep = [{"cell": "auto-1024", "concurrency": c, "requests": c, "output_tok_s": 10.0 * c, "ttft_ms_p50": 50.0 * c}
             for c in (1, 4)]
    assert throughput_plot(typed(schema.ThroughputRow, sweep), tmp_path / "t.png").read_bytes().startswith(b"\x89PNG")
    assert throughput_plot([], tmp_path / "t2.png") is None and not (tmp_path / "t2.png").exists()


def test_kl_by_position_figure_is_drawn_for_kv_comparisons_only(tmp_path):
    from pathlib import Path

    from kveval.files import schema
    from kveval.render.divergence_plot import kl_position_plot

    stored = Path(__file__).resolve().parents[2] / "reports" / "h200-smollm2" / "results.json.gz"
    divergence = schema.load("results", stored).evidence.divergence   # read as this kveval reads it (schema.upgrade)
    assert kl_position_plot(divergence, tmp_path / "kl.png").read_bytes().startswith(b"\x89PNG")
    noise_only = divergence.model_copy(
        update={"comparisons": [c for c in divergence.comparisons if c.kind.startswith("noise")]})
    assert noise_only.comparisons and kl_position_plot(noise_only, tmp_path / "none.png") is None


def test_preemptions_come_from_the_engine_counter_per_level_and_older_runs_still_read():
    counted = {**_run(4, 8.0, [0.5] * 4, [0.1] * 4), "preemptions": 3}
    older = _run(1, 2.0, [0.5], [0.1])  # a run stored before the counter: per-request fields only
    table = throughput_table(typed_cells({"auto-1024": _cell("auto", [older, counted], 1.75)})).set_index("concurrency")
    assert table.loc[4].preemptions == 3 and table.loc[1].preemptions == 0
    unknown = {**_run(4, 8.0, [0.5] * 4, [0.1] * 4), "preemptions": None}
    unknown["requests"] = [{**r, "preemptions": None} for r in unknown["requests"]]
    assert throughput_table(typed_cells({"auto-1024": _cell("auto", [unknown], 1.75)})).preemptions.isna().all()


def test_findings_name_the_levels_beyond_ten_percent_of_the_baseline():
    from kveval.analysis.throughput import ThroughputFinding, throughput_findings
    from kveval.files import schema

    def row(cell, level, ratio, pool=3.5):
        return schema.ThroughputRow.model_validate({**dict.fromkeys(schema.ThroughputRow.model_fields), "cell": cell,
                                                    "concurrency": level, "requests": level,
                                                    "output_tok_s_vs_baseline": ratio, "max_concurrency": pool})

    rows = [row("auto-1024", 1, None), row("fp8-1024", 1, 1.05), row("fp8-1024", 4, 1.2), row("fp8-1024", 8, 0.8),
            row("fp8-2048", 1, 1.1)]
    assert throughput_findings(rows) == [ThroughputFinding("fp8-1024", [4], [8], 3.5),
                                         ThroughputFinding("fp8-2048", [], [], 3.5)]   # exactly 10 %: within
    assert throughput_findings([row("auto-1024", 1, None)]) == [] and throughput_findings(None) == []
