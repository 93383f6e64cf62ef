"""Long-context tasks in the review, the heat map, the CSVs, the gate and `kveval report` (constructed runs)."""
from __future__ import annotations

import csv
import json
import re

import pytest
from click.testing import CliRunner

from kveval.cli.commands import cli
from kveval.evidence import build_evidence
from kveval.render.outputs import evidence_tables, write_results
from kveval.gate import EXIT_FAIL, EXIT_INCONCLUSIVE, evaluate
from kveval.files import schema
from kveval.files.rundir import RunDir
from kveval.render.plots import task_heatmap
from kveval.render.review import render_review
from tests.support.constructed import manifest_for, scoring_phase, started_cell, write_run
from tests.support.evidence import typed_cells, typed_evidence, typed_manifest
from tests.support.task_samples import passkey_grid, sample, with_tasks

HEATMAP_FILE = RunDir.TASK_HEATMAP

N = 300
WRONG = {(0.25, 0.0, 0), (0.5, 0.0, 1), (0.5, 0.5, 0)}
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _flat(text):
    return re.sub(r" {2,}", " ", text)


def cwe(index, correct=True, response=None):
    return sample("kveval_cwe", index, depth=None, expected=("apple", "pear"), correct=correct, response=response)


def make_cells(kind="mixed", tasks=True):
    """auto-1024 and fp8-1024 with healthy divergence; tasks:
    mixed: fp8 misses 4 of 16 (not significant); harmed: fp8 misses 10 of 20 passkeys (significant);
    healthy: same answers in both."""
    auto = started_cell("auto", 1024, 1792, [], scoring_phase(N, "same", noise_shape="same"))
    fp8 = started_cell("fp8", 1024, 3584, [], scoring_phase(N, "healthy"))
    if not tasks:
        return {"auto-1024": auto, "fp8-1024": fp8}
    if kind == "harmed":
        base = [sample("kveval_passkey", i, depth=(0.0, 0.5, 1.0)[i % 3]) for i in range(20)]
        mine = [sample("kveval_passkey", i, depth=(0.0, 0.5, 1.0)[i % 3], correct=i % 2 == 0) for i in range(20)]
    elif kind == "healthy":
        base = mine = passkey_grid() + [cwe(i) for i in range(4)]
    else:
        base = passkey_grid() + [cwe(i) for i in range(4)]
        mine = passkey_grid(wrong=WRONG) + [cwe(i, correct=i < 3, response=None if i < 3 else "<b>pear</b> | `x`")
                                            for i in range(4)]
    return {"auto-1024": with_tasks(auto, base), "fp8-1024": with_tasks(fp8, mine)}


def review_of(cells, manifest=None):
    manifest = typed_manifest(manifest or manifest_for(cells))
    evidence = build_evidence(manifest, [], typed_cells(cells))
    return render_review(manifest, evidence, evaluate(evidence)), evidence


def section(review):
    start = review.index("## Long-context tasks")
    end = review.index("\n## ", start + 1) if "\n## " in review[start + 1:] else review.index("---\nGenerated")
    return review[start:end]


# --- review ------------------------------------------------------------------------------------------

def test_review_has_task_tables_grid_and_heatmap_link():
    review, _ = review_of(make_cells("mixed"))
    review = _flat(review)
    assert review.index("## Teacher-forced divergence") < review.index("## Long-context tasks")
    text = section(review)
    assert "every expected value appears in the answer" in text and "never truncated" in text
    assert "### max_model_len 1,024" in text
    # Accuracy: k/n = % [Wilson] with the rejected count, per task and over all tasks.
    assert "| kveval\\_passkey | 12/12 = 100 % [76–100]; 6 rejected | 9/12 = 75 % [47–91]; 6 rejected |" in text
    assert "| kveval\\_cwe | 4/4 = 100 % [51–100] | 3/4 = 75 % [30–95] |" in text
    assert "| all tasks | 16/16 = 100 % [81–100]; 6 rejected | 12/16 = 75 % [51–90]; 6 rejected |" in text
    # Paired comparison: recovery, McNemar p, b / c, n paired.
    assert "| fp8-1024 vs auto-1024 | all tasks | 16 | 100.0 % | 75.0 % | 75.0 % | 0.125 | 4 | 0 | 0 |" in text
    assert "| fp8-1024 vs auto-1024 | kveval\\_passkey | 12 | 100.0 % | 75.0 % | 75.0 % | 0.25 | 3 | 0 | 0 |" in text
    # Model text escaped in the discordant examples.
    assert "&lt;b&gt;pear&lt;/b&gt; \\| \\`x\\`" in text and "<b>" not in review
    # Text grid per cell, then the heat map.
    assert "**fp8-1024**" in text and "| depth \\ prompt tokens | 256 | 512 | 1,024 |" in text
    assert "| 0 | 50 % (1/2) | 50 % (1/2) | ✗ 2 rejected |" in text
    assert "| 0.5 | 100 % (2/2) | 50 % (1/2) | ✗ 2 rejected |" in text
    assert f"![depth × length accuracy]({HEATMAP_FILE})" in text
    for line in text.splitlines():
        if line.startswith("|"):
            assert line.rstrip().endswith("|"), line


def test_review_omits_tasks_when_none_ran_and_says_when_skipped():
    cells = make_cells(tasks=False)
    manifest = manifest_for(cells)
    del manifest["options"]["tasks"]  # a manifest that does not say is not one kveval reads (typed manifest)
    with pytest.raises(schema.FileError, match=r"options\.tasks: missing"):
        schema.parse(schema.Manifest, manifest, "manifest.json")
    manifest["options"]["tasks"] = []
    _, evidence = review_of(cells, manifest)
    assert evidence.tasks == {}
    review, _ = review_of(cells, manifest)
    assert "## Long-context tasks\n\n_Skipped: the run asked for no task (`tasks: none`)._" in review
    manifest["options"]["tasks"] = ["kveval_passkey"]
    review, _ = review_of(cells, manifest)
    assert "_No cell stored task results" in review


def test_review_names_a_crashed_tasks_phase():
    cells = make_cells("mixed")
    cells["fp8-2048"] = with_tasks(started_cell("fp8", 2048, 3584, [], scoring_phase(N, "healthy")),
                                   error="RuntimeError: <lm-eval> | failed\nat line 3")
    review, evidence = review_of(cells)
    assert evidence.tasks.errors == {"fp8-2048": "RuntimeError: <lm-eval> | failed\nat line 3"}
    assert "- **fp8-2048**: the tasks phase failed: RuntimeError: &lt;lm-eval&gt; \\| failed ⏎ at line 3" in review


# --- heat map ----------------------------------------------------------------------------------------

def test_heatmap_png_is_written_small_and_none_without_data(tmp_path):
    _, evidence = review_of(make_cells("mixed"))
    path = task_heatmap(evidence.tasks.grid, tmp_path / "h.png")
    data = path.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 1000
    assert task_heatmap([], tmp_path / "none.png") is None
    no_depth = [r.model_copy(update={"depth": None}) for r in evidence.tasks.grid]
    assert task_heatmap(no_depth, tmp_path / "none.png") is None
    assert not (tmp_path / "none.png").exists()


def test_heatmap_stays_small_for_a_full_matrix(tmp_path):
    rows = []
    for length in (4096, 8192, 16384, 32768):
        for kv in ("auto", "fp8"):
            for depth in (0.0, 0.1, 0.25, 0.5, 0.75, 1.0):
                for fraction in (0.1, 0.25, 0.4, 0.55, 0.7, 0.85, 0.95, 1.05):
                    n = 0 if fraction > 1 else 12
                    rows.append({"cell": f"{kv}-{length}", "kv_spec": kv, "max_model_len": length,
                                 "depth": depth, "target_tokens": round(fraction * length), "n": n,
                                 "correct": n // 2, "rejected": 12 - n, "accuracy": 0.5 if n else None})
    path = task_heatmap(typed_evidence({"tasks": {"grid": rows}}).tasks.grid, tmp_path / "big.png")
    assert 1000 < path.stat().st_size <= 150_000


# --- tables and results --------------------------------------------------------------------------------

def test_write_results_writes_task_csvs_and_heatmap_and_removes_a_stale_one(tmp_path):
    cells = make_cells("mixed")
    evidence = build_evidence(typed_manifest({}), [], typed_cells(cells))
    verdict = evaluate(evidence)
    write_results(tmp_path, evidence, verdict)
    assert (tmp_path / HEATMAP_FILE).read_bytes().startswith(PNG_MAGIC)
    with open(tmp_path / "tables" / "task_samples.csv", newline="") as handle:
        samples = list(csv.DictReader(handle))
    assert len(samples) == 44 and json.loads(samples[0]["expected"]) == ["71432"]
    assert {s["accepted"] for s in samples} == {"True", "False"}
    with open(tmp_path / "tables" / "task_comparisons.csv", newline="") as handle:
        pooled = [r for r in csv.DictReader(handle) if r["task"] == "ALL"]
    assert (pooled[0]["n_paired"], pooled[0]["baseline_only"], pooled[0]["mcnemar_p"]) == ("16", "4", "0.125")

    bare = build_evidence(typed_manifest({}), [], typed_cells(make_cells(tasks=False)))
    write_results(tmp_path, bare, evaluate(bare))
    assert not (tmp_path / HEATMAP_FILE).exists()
    for name in ("task_samples", "task_accuracy", "task_comparisons", "task_grid"):
        header = (tmp_path / "tables" / f"{name}.csv").read_text().splitlines()
        assert len(header) == 1 and header[0].startswith("cell,")
    assert set(evidence_tables(bare)) >= {"task_samples", "task_accuracy", "task_comparisons", "task_grid"}


# --- gate and `kveval report` end to end -------------------------------------------------------------------

# 16 paired samples cannot show non-inferiority, so even a perfect pairing is INCONCLUSIVE (and these
# constructed cells' documents, 300 positions, do not reach the late half of 1024 either); a drop shown
# under the harm bar FAILs.
@pytest.mark.parametrize("kind, code, status", [("healthy", EXIT_INCONCLUSIVE, "INCONCLUSIVE"),
                                                ("mixed", EXIT_INCONCLUSIVE, "INCONCLUSIVE"),
                                                ("harmed", EXIT_FAIL, "FAIL")])
def test_report_cli_on_a_run_with_task_samples(tmp_path, kind, code, status):
    path = tmp_path / kind
    write_run(path, [], make_cells(kind))
    result = CliRunner().invoke(cli, ["report", str(path)])
    assert result.exit_code == code, result.output
    results = json.loads((path / "results.json").read_text())
    assert results["verdict"]["status"] == status
    (task_check,) = [c for c in results["verdict"]["checks"] if c["name"].startswith("task_")]
    assert task_check["cell"] == "fp8-1024"
    assert task_check["passed"] == {"healthy": None, "mixed": None, "harmed": False}[kind]
    review = _flat((path / "review.md").read_text())
    assert f"## Verdict: **{status}**" in review and "## Long-context tasks" in review
    assert (path / HEATMAP_FILE).exists() and (path / "tables" / "task_accuracy.csv").exists()
    if kind == "harmed":
        assert ("- fp8-1024: task accuracy drop shown: recovery 50.0 %, upper bound 77.1 % < 90.0 % "
                "(accuracy 50.0 % vs 100.0 % on 20 paired samples (10 only auto right, 0 only this cell), "
                "McNemar p 0.002") in review
        assert "99 % upper bound 77.1 %" in review
    elif kind == "mixed":
        assert ("- fp8-1024: task accuracy neither shown non-inferior nor shown to drop: recovery 75.0 %, lower bound "
                "54.5 % < margin 90.0 %, upper bound 108.8 % ≥ harm bar 90.0 % (16 paired samples)") in review
        assert "would show whether it is under the harm bar 90.0 %" in review
    else:
        assert "- fp8-1024: task accuracy neither shown non-inferior nor shown to drop: recovery 100.0 %" in review
        assert "**to decide:** about" in review and "paired samples per cell (now 16)" in review


def test_failed_single_task_is_reported_and_noted():
    cells = make_cells("healthy")
    cells["fp8-1024"]["phases"]["tasks"]["task_errors"] = {"kveval_vt": "ValueError: <bad> | yaml"}
    review, evidence = review_of(cells)
    assert "- **fp8-1024** / kveval\\_vt: this task failed (the others ran): ValueError: &lt;bad&gt; \\| yaml" in review
    verdict = evaluate(evidence)
    assert "fp8-1024: task kveval_vt failed and is left out of its task accuracy" in [r.message for r in verdict.reasons]
