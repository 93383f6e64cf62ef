"""A quality reference where `auto` cannot start on the run's budget (kveval.run.reference): planned
only for kv_capacity failures beside a started tested cell, sized to the length, judged against, and
never counted as capacity or speed."""
from __future__ import annotations

from kveval.evidence import build_evidence
from kveval.files import schema
from kveval.gate import PASS, evaluate
from kveval.inputs.kvspec import parse_kv
from kveval.run.cell_process import CellPlan
from kveval.run.reference import plan_references, reference_id
from tests.support.constructed import complete_cell, failed_cell, manifest_for, scoring_phase, started_cell
from tests.support.evidence import typed_cells, typed_manifest

# SmolLM2: 23,040 B/token in bf16
LAYOUT = {"layers": 30, "kv_heads": 3, "head_dim": 64, "attention": "gqa", "per_layer_elements": 384,
          "sliding_window_layers": [], "sliding_window": None}


def _plan(kv: str, length: int, budget: int | None = 40 * 2 ** 20) -> CellPlan:
    return CellPlan(id=f"{kv}-{length}", kv=parse_kv(kv), max_model_len=length,
                    engine={"model": "/m", "kv_cache_dtype": kv, "max_model_len": length, "kv_cache_memory_bytes": budget},
                    phases=["generation", "scoring", "speed", "tasks", "throughput"])


def _manifest(cells):
    manifest = manifest_for(cells)
    manifest["model"]["kv_layout"] = LAYOUT
    return manifest


def _planned(cells, plans):
    """plan_references on the typed cells and manifest, as compare reads them from the run directory."""
    typed = {name: schema.parse(schema.CellResult, complete_cell(facts), name) for name, facts in cells.items()}
    return plan_references(typed, plans, schema.parse(schema.Manifest, _manifest(cells), "manifest"))


def _capacity_failed(kv: str, length: int) -> dict:
    return failed_cell(kv, length, reason="kv_capacity", message="ValueError: ... estimated maximum model length is 1664")


def test_a_capacity_failure_beside_a_started_fp8_cell_gets_a_reference_sized_to_its_length():
    cells = {"auto-2048": _capacity_failed("auto", 2048),
             "fp8-2048": started_cell("fp8", 2048, 3584, [], scoring=scoring_phase(300, "healthy"))}
    plans = [_plan("auto", 2048), _plan("fp8", 2048)]
    [(plan, why)] = _planned(cells, plans)
    assert plan.id == reference_id("auto-2048") == "auto-2048.reference"
    assert plan.kv.text == "auto" and plan.max_model_len == 2048
    assert plan.phases == ["generation", "scoring", "tasks"]            # no speed or throughput figures
    # max(2 x 40 MiB, 2,048 tokens x 23,040 B x 1.25) = 80 MiB
    assert plan.engine["kv_cache_memory_bytes"] == 80 * 2 ** 20
    assert "kv_capacity" in why and "quality only" in why


def test_no_reference_for_other_failures_or_without_a_started_tested_cell():
    unsupported = {"auto-2048": failed_cell("auto", 2048, reason="oom"),
                   "fp8-2048": started_cell("fp8", 2048, 3584, [])}
    nothing_started = {"auto-2048": _capacity_failed("auto", 2048), "fp8-2048": failed_cell("fp8", 2048)}
    plans = [_plan("auto", 2048), _plan("fp8", 2048)]
    assert _planned(unsupported, plans) == []
    assert _planned(nothing_started, plans) == []


def test_the_reference_is_the_baseline_for_quality_and_absent_from_capacity():
    cells = {"auto-2048": _capacity_failed("auto", 2048),
             "fp8-2048": started_cell("fp8", 2048, 3584, [], scoring=scoring_phase(1200, "healthy")),
             "auto-2048.reference": started_cell("auto", 2048, 3584, [], scoring=scoring_phase(1200, "same"))}
    cells["auto-2048.reference"]["cell"] = "auto-2048.reference"
    manifest = _manifest(cells)
    manifest["quality_references"] = {"auto-2048.reference": {"for": "auto-2048", "kv_cache_memory_bytes": 80 * 2 ** 20,
                                                              "why": "..."}}
    evidence = build_evidence(typed_manifest(manifest), [], typed_cells(cells))
    assert evidence.cells["auto-2048.reference"].reference_for == "auto-2048"
    assert all(row.cell != "auto-2048.reference" for row in evidence.startup)
    assert all("auto-2048.reference" not in str(row) for row in evidence.pools)
    [comparison] = [c for c in evidence.divergence.comparisons if c.kind == "kv"]
    assert comparison.reference == "auto-2048.reference" and comparison.same_length
    verdict = evaluate(evidence)
    assert verdict.cells == {"fp8-2048": PASS}
    assert any("judged against auto-2048.reference" in r.message and "quality only" in r.message
               for r in verdict.reasons)
