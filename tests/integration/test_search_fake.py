"""`kveval compare --search` (issue 20) through the real orchestration with the fake engine and the fake
calibration (KVEVAL_ENGINE=fake): the ladder's order, where it stops, candidates the engine refuses, and
what the review recommends. The diagnosis is real (transformers on a model planted with K×128 in
layers 3 and 17); the fake engine's damage says which configuration heals what."""
from __future__ import annotations

import json

import pytest

import kveval
from kveval.gate import FAIL, INCONCLUSIVE, NOT_STARTED, PASS
from kveval.inputs.kvspec import KVSpec
from kveval.run.calibration import toolkit_dir
from kveval.run.search import ladder, search_step
from tests.support.planted import plant
from tests.support.quiet import Quiet

PLANTED = [3, 17]
COUNTS = {"short_256": 2, "short_512": 0, "probe": 2, "ctx_1k": 0, "ctx_pct": 0, "over": 0}


def search_run(root, model, damage: dict, patch: pytest.MonkeyPatch):
    patch.setenv("KVEVAL_ENGINE", "fake")
    patch.setenv("KVEVAL_NO_PLOTS", "1")
    patch.setenv("KVEVAL_HOME", str(root / "home"))
    (toolkit_dir()).mkdir(parents=True)          # llm-compressor "installed": the fake calibration needs none
    (toolkit_dir() / ".complete").write_text("test")
    patch.setenv("KVEVAL_FAKE_DAMAGE", json.dumps(damage))
    return kveval.compare(model=str(model), max_model_len=[1024], kv_cache_memory="60MiB", suite="quick",
                          tasks=["none"], out=root / "run", progress=Quiet(), counts=COUNTS, search=True,
                          phases=("generation", "scoring"))


def planted_model(tmp_path_factory, default_model_dir):
    root = tmp_path_factory.mktemp("planted")
    return plant(default_model_dir, root / "model", tensor="k", factor=128, layers=PLANTED)


@pytest.fixture(scope="module")
def scales_heal(tmp_path_factory, default_model_dir):
    planted = planted_model(tmp_path_factory, default_model_dir)
    """Calibrated per-tensor scales cure the planted range damage: the search stops at fp8:scaled."""
    patch = pytest.MonkeyPatch()
    try:
        yield search_run(tmp_path_factory.mktemp("heal"), planted,
                      {"fp8_noise": 0.15, "layers": {"3": 0.6, "17": 0.6}, "scales_heal": ["tensor"]}, patch)
    finally:
        patch.undo()


def test_the_search_stops_at_the_first_candidate_that_passes(scales_heal):
    run = scales_heal
    assert run.verdict.cells == {"fp8-1024": FAIL, "fp8:scaled-1024": PASS}, [r.message for r in run.verdict.reasons]
    assert [c.id for c in run.manifest.cells] == ["auto-1024", "fp8-1024", "fp8:scaled-1024"]
    length = run.evidence.search.lengths[0]
    assert (length.tried, length.chosen, length.next) == (["fp8", "fp8:scaled"], "fp8:scaled", None)
    candidates = run.evidence.search.candidates
    # Then the diagnosed layers, the one furthest over the FP8 range first, then both; then with scales.
    assert candidates[:3] == ["fp8", "fp8:scaled", "fp8:scaled=head"]
    assert candidates[3] in ("fp8:keep=3", "fp8:keep=17") and candidates[4] == "fp8:keep=3,17"
    assert candidates[5:] == ["fp8:scaled," + candidates[3].split(":")[1], "fp8:scaled,keep=3,17"]


def test_a_scaled_cell_loads_the_calibrated_copy_and_the_review_deploys_it(scales_heal):
    run = scales_heal
    entry = run.evidence.calibration["tensor"]
    assert entry.calibrated_by_kveval and entry.scales.calibrated and entry.record["strategy"] == "tensor"
    assert entry.record["documents"] == ["beekeeping.txt", "glassblowing.txt", "printing_press.txt", "tides.txt"]
    assert run.cell("fp8:scaled", 1024).engine_settings.model == entry.path
    assert run.cell("fp8", 1024).engine_settings.model != entry.path
    review = (run.run_dir / "review.md").read_text()
    assert f"`vllm serve {entry.path} --kv-cache-dtype fp8 --max-model-len " in review
    assert "## Search" in review and "## Calibrated scales" in review
    assert "FP8 with calibrated per-tensor scales passes at 1024" in review
    # The scales next to the measured ranges: layer 3's K peak is 128× the healthy one's.
    assert "K limit (448 × scale)" in review and "| k_scale " in review


def test_a_search_candidate_that_passes_where_plain_fp8_fails_exits_4(scales_heal):
    # Issue 41: --search's candidates are not what was asked (--kv fp8 auto), so plain FP8 FAILs as asked and
    # the candidate it found is the deployable one: exit 4, 0 under `kveval gate --require any`.
    from click.testing import CliRunner

    from kveval.api import run_exit_code
    from kveval.cli.commands import cli

    decision = scales_heal.decision
    assert (decision.asked, decision.asked_configurations) == (FAIL, ["fp8"])
    assert (decision.deployable, decision.configuration, decision.max_model_len) == (PASS, "fp8:scaled", 1024)
    assert run_exit_code(decision) == 4 and run_exit_code(decision, "any") == 0
    assert CliRunner().invoke(cli, ["gate", "--json", str(scales_heal.run_dir)]).exit_code == 4
    assert CliRunner().invoke(cli, ["gate", "--json", "--require", "any", str(scales_heal.run_dir)]).exit_code == 0


def test_the_ladder_puts_capacity_first_and_keeps_the_worst_layers_first():
    specs = [spec.text for spec in ladder(None)]
    assert specs == ["fp8", "fp8:scaled", "fp8:scaled=head"]


def test_the_ladder_never_keeps_every_layer():
    # K x128 in every layer (reports/cpu-planted-all-layers-1024): keeping all 6 is the auto cache, not a candidate.
    from kveval.analysis.kv_range import diagnose
    from kveval.files.schema import Diagnosis
    from tests.unit.test_remedy import ranges

    every = [spec.text for spec in ladder(Diagnosis.model_validate(diagnose(ranges({i: 60 for i in range(6)}))))]
    assert every == ["fp8", "fp8:scaled", "fp8:scaled=head", "fp8:keep=0", "fp8:keep=0,1", "fp8:keep=0,1,2,3",
                     "fp8:scaled,keep=0", "fp8:scaled,keep=0,1", "fp8:scaled,keep=0,1,2,3"]
    some = [spec.text for spec in ladder(Diagnosis.model_validate(diagnose(ranges({1: 60, 4: 90}))))]
    assert some[3:] == ["fp8:keep=1", "fp8:keep=1,4", "fp8:scaled,keep=1", "fp8:scaled,keep=1,4"]   # equal peaks


def test_search_step_plans_the_next_candidate_and_ends_where_it_must():
    candidates = [KVSpec("fp8"), KVSpec("fp8", scaled="tensor"), KVSpec("fp8", ("0",))]
    # Nothing ran yet: plain fp8 first.
    assert search_step(candidates, [1024], {}, {})[0].next == "fp8"
    # FAIL, then INCONCLUSIVE (its budget spent): the next; PASS: stop.
    step = search_step(candidates, [1024], {"fp8-1024": FAIL, "fp8:scaled-1024": INCONCLUSIVE}, {})[0]
    assert (step.next, step.tried) == ("fp8:keep=0", ["fp8", "fp8:scaled"])
    step = search_step(candidates, [1024], {"fp8-1024": PASS}, {})[0]
    assert (step.chosen, step.next) == ("fp8", None)
    # Plain FP8 did not start: no FP8 candidate can, the length ends with vLLM's reason.
    step = search_step(candidates, [1024], {"fp8-1024": NOT_STARTED}, {"fp8-1024": "unsupported_dtype"})[0]
    assert step.next is None and step.chosen is None and "unsupported_dtype" in step.notes[0]
    # Every candidate failed: none passes, said once.
    statuses = {f"{spec.text}-1024": FAIL for spec in candidates}
    step = search_step(candidates, [1024], statuses, {})[0]
    assert step.next is None and step.notes == ["1024: none of the 3 candidates passes"]
    # Lengths are independent.
    steps = search_step(candidates, [1024, 2048], {"fp8-1024": PASS, "fp8-2048": FAIL}, {})
    assert [(s.chosen, s.next) for s in steps] == [("fp8", None), (None, "fp8:scaled")]
