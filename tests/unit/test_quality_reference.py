"""A quality reference where `auto` cannot start on the run's budget (kveval.run.reference): planned
only for kv_capacity failures beside a started tested cell, sized to the length, judged against, and
never counted as capacity or speed."""
from __future__ import annotations

from kveval.evidence import build_evidence
from kveval.files import schema
from kveval.gate import PASS, evaluate
from kveval.inputs.kvspec import parse_kv
from kveval.run.cell_process import CellPlan
from kveval.run.reference import kv_shortfall_bytes, offload_gib, plan_references, reference_id
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


def _planned(cells, plans, mode="auto", model_path=None):
    """plan_references on the typed cells and manifest, as compare reads them from the run directory:
    [(plan, why)] of the references planned (the lines for lengths left without one: `_unplanned`)."""
    return [(ref.plan, ref.why) for ref in _plan_references(cells, plans, mode, model_path)[0]]


def _unplanned(cells, plans, mode="auto", model_path=None):
    return _plan_references(cells, plans, mode, model_path)[1]


def _plan_references(cells, plans, mode, model_path):
    typed = {name: schema.parse(schema.CellResult, complete_cell(facts), name) for name, facts in cells.items()}
    manifest = _manifest(cells)
    if model_path is not None:
        manifest["model"]["path"] = str(model_path)
    return plan_references(typed, plans, schema.parse(schema.Manifest, manifest, "manifest"), mode)


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


# vLLM 0.26's words when one request of the length does not fit the card's share (kv_cache_utils.py).
CARD_FULL = ("ValueError: To serve at least one request with the model's max seq len (32768), (0.88 GiB KV cache is "
             "needed, which is larger than the available KV cache memory (0.62 GiB). Based on the available memory, "
             "the estimated maximum model length is 23024. Try increasing `gpu_memory_utilization`")


def _card_full(kv: str, length: int) -> dict:
    return failed_cell(kv, length, reason="kv_capacity", message=CARD_FULL)


def test_vllms_needed_and_available_kv_are_read_from_its_words():
    assert kv_shortfall_bytes(CARD_FULL) == (int(0.88 * 2 ** 30), int(0.62 * 2 ** 30))
    assert kv_shortfall_bytes("ValueError: estimated maximum model length is 1664") is None


def test_on_a_physical_budget_no_reference_starts_unless_offload_is_asked_and_the_line_names_the_options():
    cells = {"auto-32768": _card_full("auto", 32768), "fp8-32768": started_cell("fp8", 32768, 40000, [])}
    plans = [_plan("auto", 32768, budget=None), _plan("fp8", 32768, budget=None)]
    assert _planned(cells, plans) == []    # a larger KV budget would be memory the card does not have
    [line] = _unplanned(cells, plans)
    assert "--reference offload" in line and "--baseline-from" in line
    assert _planned(cells, plans, mode="off") == [] and _unplanned(cells, plans, mode="off") == []


def test_the_offload_reference_moves_the_missing_kv_in_weights_to_host_memory_on_the_same_share():
    cells = {"auto-32768": _card_full("auto", 32768), "fp8-32768": started_cell("fp8", 32768, 40000, [])}
    plans = [_plan("auto", 32768, budget=None), _plan("fp8", 32768, budget=None)]
    [(plan, why)] = _planned(cells, plans, mode="offload")
    assert plan.id == "auto-32768.reference" and plan.phases == ["generation", "scoring", "tasks"]
    # (0.88 - 0.62) GiB lacking x 1.5 + 0.5 GiB = 0.89 GiB, rounded up to 1 GiB; no weight files: no cap.
    assert plan.engine["extra"]["cpu_offload_gb"] == 1.0
    assert plan.engine["kv_cache_memory_bytes"] is None     # the same share of the card, not a larger budget
    assert "cpu_offload_gb" in why and "quality only" in why
    record = _plan_references(cells, plans, "offload", None)[0][0].record
    assert record.cpu_offload_gb == 1.0 and record.kv_cache_memory_bytes is None and record.for_ == "auto-32768"


def test_the_offload_is_capped_by_the_weights_and_refused_when_they_cannot_free_enough(tmp_path):
    manifest = schema.parse(schema.Manifest, _manifest({"auto-32768": _card_full("auto", 32768)}), "manifest")
    failure = schema.Failure(reason="kv_capacity", message=CARD_FULL, estimated_max_model_len=23024, backend=None)
    assert offload_gib(failure, manifest, 32768, weights=None) == 1.0
    assert offload_gib(failure, manifest, 32768, weights=int(0.8 * 2 ** 30)) == 0.75   # all the weights, stepped
    assert offload_gib(failure, manifest, 32768, weights=int(0.2 * 2 ** 30)) is None   # 0.26 GiB lacking > 0.2
    # Without vLLM's figures: the whole request's KV from the capacity model (32,768 x 23,040 B = 0.70 GiB).
    bare = schema.Failure(reason="kv_capacity", message="No available memory for the cache blocks",
                          estimated_max_model_len=None, backend=None)
    assert offload_gib(bare, manifest, 32768, weights=None) == 1.75   # 0.70 x 1.5 + 0.5 = 1.55 -> 1.75
    # A local model's weight files cap it.
    (tmp_path / "model.safetensors").write_bytes(b"\0" * 2 ** 20)
    cells = {"auto-32768": _card_full("auto", 32768), "fp8-32768": started_cell("fp8", 32768, 40000, [])}
    plans = [_plan("auto", 32768, budget=None), _plan("fp8", 32768, budget=None)]
    assert _planned(cells, plans, mode="offload", model_path=tmp_path) == []
    [line] = _unplanned(cells, plans, mode="offload", model_path=tmp_path)
    assert "--baseline-from" in line


def test_an_offload_reference_is_named_as_such_in_the_verdict():
    cells = {"auto-2048": _capacity_failed("auto", 2048),
             "fp8-2048": started_cell("fp8", 2048, 3584, [], scoring=scoring_phase(1200, "healthy")),
             "auto-2048.reference": started_cell("auto", 2048, 3584, [], scoring=scoring_phase(1200, "same"))}
    cells["auto-2048.reference"]["cell"] = "auto-2048.reference"
    manifest = _manifest(cells)
    manifest["quality_references"] = {"auto-2048.reference": {"for": "auto-2048", "kv_cache_memory_bytes": None,
                                                              "why": "...", "cpu_offload_gb": 1.5}}
    verdict = evaluate(build_evidence(typed_manifest(manifest), [], typed_cells(cells)))
    assert verdict.cells == {"fp8-2048": PASS}
    assert any("1.5 GiB of weights offloaded to host memory" in r.message and "not a capacity or speed figure"
               in r.message for r in verdict.reasons)
