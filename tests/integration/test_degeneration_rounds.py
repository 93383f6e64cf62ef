"""Degeneration evidence until decided, end to end on the fake engine (KVEVAL_ENGINE=fake, no vLLM, so
every CPU kind runs it): loops planted per KV dtype (worker/fake_engine.py), the first look judged on
the 100 probes, rounds of new probes in the cell and its baseline until the comparison is decided or the
budget's 600 outputs are judged, and `kveval report` re-judging the stored run the same way."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

import kveval
from kveval.cli.commands import cli
from kveval.files.rundir import RunDir, read_json
from tests.support.quiet import Quiet

ONLY_PROBES = {"short_256": 0, "short_512": 0, "probe": 100, "ctx_1k": 0, "ctx_pct": 0, "over": 0}


def _compare(root, default_model_dir, loops: dict, name: str):
    patch = pytest.MonkeyPatch()
    patch.setenv("KVEVAL_ENGINE", "fake")
    patch.setenv("KVEVAL_FAKE_DAMAGE", json.dumps({"fp8_noise": 0.15, "loops": loops}))
    patch.setenv("KVEVAL_NO_PLOTS", "1")   # the review and the stored evidence are read here, no figure
    try:
        return kveval.compare(model=str(default_model_dir), kv=["fp8", "auto"], max_model_len=[1024],
                              kv_cache_memory="60MiB", suite="quick", tasks=["none"], out=root / name,
                              progress=Quiet(), counts=ONLY_PROBES, phases=("generation", "scoring"),
                              diagnose=False)  # no K/V range pass: degeneration is the subject, not its cause
    finally:
        patch.undo()


@pytest.fixture(scope="module")
def leaning(tmp_path_factory, default_model_dir):
    """FP8 loops on 18 % of prompts, auto on 10 %: an excess of about 8 points, between the FAIL margin
    (5 %) and the PASS margin (10 %), so no look can settle it and the rounds run to the budget."""
    return _compare(tmp_path_factory.mktemp("deg"), default_model_dir, {"auto": 0.10, "fp8": 0.18}, "leaning")


def test_rounds_of_new_probes_run_until_the_budget_and_the_last_look_is_final(leaning):
    manifest = RunDir(leaning.run_dir).load_manifest()
    record = manifest["task_rounds"]
    assert [r["probe_cells"] for r in record["rounds"]] == [["auto-1024", "fp8-1024"]] * 3
    assert [r["probes"]["count"] for r in record["rounds"]] == [100, 200, 200]   # doubling, capped at 600
    assert all(r["task_cells"] == [] for r in record["rounds"])                 # tasks off: probes only
    entry = leaning.evidence.degeneration.cells["fp8-1024"]
    assert entry.looks == [100, 200, 400, 600] and entry.n_max == 600 and entry.final is True
    assert record["final_degeneration"] == ["fp8-1024"]
    assert leaning.verdict.cells["fp8-1024"] == "INCONCLUSIVE"
    (reason,) = [r for r in leaning.verdict.reasons if r.cell == "fp8-1024" and r.level == "INCONCLUSIVE"]
    assert "of 600 outputs degenerate" in reason.message and "(the final look)" in reason.message
    assert "--prompts FILE" in reason.decide
    review = (leaning.run_dir / "review.md").read_text()
    assert "**Rounds of more evidence** (`--budget 600,20m`): round 1 at 1024: 100 new probes for fp8-1024" in review


def test_no_round_repeats_a_probe_and_the_baseline_answers_the_same_ones(leaning):
    run = RunDir(leaning.run_dir)
    prompts = run.load_workloads(run.load_manifest())
    assert len(prompts) == 600
    assert len({p["id"] for p in prompts}) == 600 and len({p["text"] for p in prompts}) == 600
    cells = run.load_cells()
    answered = {name: {r["prompt_id"] for r in facts["phases"]["generation"]["records"]} for name, facts in cells.items()}
    assert answered["auto-1024"] == answered["fp8-1024"] == {p["id"] for p in prompts}


def test_report_re_judges_the_stored_rounds_the_same_way(leaning, tmp_path, monkeypatch):
    monkeypatch.setenv("KVEVAL_NO_PLOTS", "1")
    result = CliRunner().invoke(cli, ["report", str(leaning.run_dir)])
    assert result.exit_code == 3, result.output
    stored = read_json(RunDir(leaning.run_dir).results_path)
    assert stored["verdict"]["cells"]["fp8-1024"] == "INCONCLUSIVE"
    assert stored["evidence"]["degeneration"]["cells"]["fp8-1024"]["looks"] == [100, 200, 400, 600]


def test_a_clear_excess_fails_at_the_first_look_without_rounds(tmp_path, default_model_dir):
    harmed = _compare(tmp_path, default_model_dir, {"auto": 0.05, "fp8": 0.25}, "harmed")
    assert harmed.verdict.cells["fp8-1024"] == "FAIL"
    check = next(c for c in harmed.verdict.checks if c.cell == "fp8-1024" and c.name == "new_degenerate_share")
    assert "look 1 of a sequential design over at most 600 outputs" in check.detail
    assert RunDir(harmed.run_dir).load_manifest()["task_rounds"]["rounds"] == []
