"""`kveval diff RUN_A RUN_B`: two runs of one model compared, on published reports and on constructed
pairs (a copy of a published run with one figure changed)."""
from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from kveval.analysis.run_diff import DEFAULT_KL_NOISE, newcombe_interval
from kveval.api import EXIT_USAGE, EXIT_WORSE, KvevalError, diff_markdown, diff_runs
from kveval.cli.commands import cli

REPORTS = Path(__file__).resolve().parents[2] / "reports"
# Published verdicts as re-judged by the three-zone gate (025f203: every former PASS is INCONCLUSIVE).
SMOLLM2 = REPORTS / "h200-smollm2-defaults"              # fp8-2048 INCONCLUSIVE, fp8-8192 MISSING
SMOLLM2_8192 = REPORTS / "h200-smollm2-8192-defaults"    # fp8-8192 INCONCLUSIVE
QWEN_DEFAULTS = REPORTS / "h200-qwen2.5-coder-1.5b-defaults"
QWEN = REPORTS / "h200-qwen2.5-coder-1.5b"
BISECT = REPORTS / "h200-qwen2.5-coder-1.5b-keep-layers-bisect"
PLANTED_SEARCH = REPORTS / "h200-planted-search"         # fp8-2048 INCONCLUSIVE (60 task samples)
PLANTED_LAYERS = REPORTS / "h200-planted-layers"         # fp8-2048 FAIL (divergence harm, task drop on 270)


def run_cli(*args) -> "click.testing.Result":
    return CliRunner().invoke(cli, ["diff", *map(str, args)])


def copy_run(source: Path, target: Path) -> Path:
    """A run directory holding the source's manifest and its results as plain results.json."""
    target.mkdir(parents=True)
    shutil.copy(source / "manifest.json", target / "manifest.json")
    (target / "results.json").write_bytes(gzip.decompress((source / "results.json.gz").read_bytes()))
    return target


def edit(run: Path, name: str, change) -> None:
    path = run / name
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def kv_comparison(results: dict, cell: str) -> dict:
    return next(c for c in results["evidence"]["divergence"]["comparisons"] if c["kind"] == "kv" and c["cell"] == cell)


# --- published reports -------------------------------------------------------------------------------

def test_published_pair_with_one_cell_in_common():
    result = run_cli(SMOLLM2, SMOLLM2_8192)
    assert result.exit_code == 0, result.output
    assert "Only in A: fp8-2048 (INCONCLUSIVE)." in result.output
    assert "| fp8-8192 | MISSING → INCONCLUSIVE" in result.output
    diff = diff_runs(SMOLLM2, SMOLLM2_8192)
    # MISSING and INCONCLUSIVE both reached no verdict: they rank alike, so the change is neither way.
    assert [c.cell for c in diff.cells] == ["fp8-8192"] and diff.cells[0].verdict_change == "same"
    assert (diff.cells[0].verdict_a, diff.cells[0].verdict_b) == ("MISSING", "INCONCLUSIVE")
    assert [c.cell for c in diff.only_in_a] == ["fp8-2048"] and not diff.only_in_b
    assert not diff.worse


def test_published_pair_of_other_suites_is_shown_not_judged_and_tasks_get_an_interval():
    diff = diff_runs(QWEN_DEFAULTS, QWEN)
    assert [c.cell for c in diff.only_in_a] == ["fp8:keep=0,1-8192"]
    assert [c.cell for c in diff.only_in_b] == ["fp8-32768"]
    (cell,) = diff.cells
    assert cell.verdict_a == cell.verdict_b == "FAIL"
    # Another suite scored other text: the KL change is shown, never called beyond noise.
    assert cell.divergence.basis == "other text" and cell.divergence.kl_mean.beyond_noise is None
    tasks = cell.tasks
    assert (tasks.n_a, tasks.n_b) == (270, 162)
    assert -1 <= tasks.ci_low < tasks.accuracy.delta < tasks.ci_high <= 1
    assert tasks.accuracy.beyond_noise is False
    assert cell.pool.ratio > 0 and cell.pool.tokens_b < cell.pool.tokens_a
    assert not diff.worse
    assert run_cli(QWEN_DEFAULTS, QWEN).exit_code == 0


def test_partly_shared_sequences_are_compared_on_the_common_ones():
    diff = diff_runs(BISECT / "fa3-defaults", BISECT / "fa3-graphs-half-memory")
    (cell,) = diff.cells
    divergence = cell.divergence
    assert divergence.basis == "common sequences"
    assert (divergence.sequences_a, divergence.sequences_b, divergence.sequences_common) == (6, 1, 1)
    assert divergence.kl_mean.beyond_noise is False   # the one shared document scores alike
    assert divergence.kl_mean_all.a != divergence.kl_mean.a


def test_a_published_regression_exits_with_the_worse_code():
    # Eager mode at half the memory broke the kept-layers cells (an engine defect): both verdicts stay
    # INCONCLUSIVE under the three-zone gate, but KL rises far beyond the noise floor, which is worse.
    result = run_cli(BISECT / "fa3-defaults", BISECT / "fa3-eager-half-memory")
    assert result.exit_code == EXIT_WORSE == 5, result.output
    assert "**B got worse than A** in 2 of 2 matched cells" in result.output
    assert "- fp8:keep=0-8192: KL mean 0.00629 -> 0.104 (up 0.0981" in result.output
    diff = diff_runs(BISECT / "fa3-defaults", BISECT / "fa3-eager-half-memory")
    for cell in diff.cells:
        assert cell.verdict_change == "same" and cell.divergence.kl_mean.harmful
        assert any(w.startswith("KL mean") for w in cell.why_worse)


def test_a_published_verdict_regression_exits_with_the_worse_code():
    # The planted model: its --search run stopped undecided on 60 task samples; the run with 270 FAILs it.
    result = run_cli(PLANTED_SEARCH, PLANTED_LAYERS)
    assert result.exit_code == EXIT_WORSE, result.output
    assert "**B got worse than A**" in result.output and "- fp8-2048: verdict INCONCLUSIVE -> FAIL" in result.output
    assert "| fp8-2048 " in result.output and "| INCONCLUSIVE → FAIL **worse** |" in result.output
    (cell,) = [c for c in diff_runs(PLANTED_LAYERS, PLANTED_SEARCH).cells if c.cell == "fp8-2048"]
    assert cell.verdict_change == "better" and not cell.why_worse   # FAIL → INCONCLUSIVE, the other way


def test_the_same_run_twice_changes_nothing():
    diff = diff_runs(REPORTS / "h200-smollm2", REPORTS / "h200-smollm2")
    assert not diff.worse and not diff.only_in_a and not diff.only_in_b and len(diff.cells) == 2
    for cell in diff.cells:
        assert cell.verdict_change == "same" and not cell.why_worse
        assert cell.divergence.basis == "same sequences"
        assert cell.divergence.kl_mean.delta == 0 and cell.divergence.kl_mean.beyond_noise is False
        assert cell.divergence.top1_agreement.beyond_noise is False
        assert cell.tasks.accuracy.beyond_noise is False
    assert all(s.decode_vs_spread in ("within", "too few runs") for s in diff.speed)
    result = run_cli("--json", REPORTS / "h200-smollm2", REPORTS / "h200-smollm2")
    assert result.exit_code == 0, result.output
    document = json.loads(result.output)
    assert document["worse"] is False and document["kl_noise_threshold"] > 0
    assert {c["cell"] for c in document["cells"]} == {"fp8-2048", "fp8-8192"}


# --- the recommendation (issue 41) -----------------------------------------------------------------

H100_SMOLLM2 = REPORTS / "h100-smollm2-8192"    # fp8 PASS at 8192: deploys fp8, exit 0
H100_QWEN = REPORTS / "h100-qwen2.5-coder-1.5b-8192"   # fp8 FAIL, fp8:keep=0,1 PASS: deploys the remedy


def test_a_changed_recommendation_is_reported_not_nothing_got_worse():
    # SmolLM2 on the H200 (fp8 undecided: keep auto, exit 3) and on the H100 (fp8 passes at 8192, exit 0): no
    # matched cell got worse, but what to deploy changed, which "Nothing got worse" alone used to hide.
    result = run_cli(REPORTS / "h200-smollm2", H100_SMOLLM2)
    assert result.exit_code == 0, result.output   # reported, not judged worse
    assert "Nothing got worse" not in result.output
    assert ("**The recommendation changed** (deploy command, configuration, max-model-len cap, passes at, exit code); "
            "no verdict of the 1 matched cell rose") in result.output
    assert ("- deploy command: `vllm serve MODEL --kv-cache-dtype auto` → `vllm serve MODEL --kv-cache-dtype fp8 "
            "--max-model-len 8192`") in result.output
    assert "- configuration: `none (keep auto)` → `fp8`" in result.output
    assert "- max-model-len cap: `–` → `8192`" in result.output and "- exit code: `3` → `0`" in result.output
    document = json.loads(run_cli("--json", REPORTS / "h200-smollm2", H100_SMOLLM2).output)
    assert document["recommendation_changed"] is True and document["worse"] is False
    rows = {row["name"]: (row["a"], row["b"], row["changed"]) for row in document["recommendation"]}
    assert rows["configuration"] == ("none (keep auto)", "fp8", True)
    assert rows["max-model-len cap"] == (None, "8192", True) and rows["exit code"] == ("3", "0", True)


def test_the_same_recommendation_is_no_change():
    diff = diff_runs(H100_QWEN, H100_QWEN)
    assert not diff.recommendation_changed and not any(row.changed for row in diff.recommendation)
    assert {row.name: row.b for row in diff.recommendation}["configuration"] == "fp8:keep=0,1"
    assert "**Nothing got worse** in 2 matched cells" in diff_markdown(diff)


def test_a_lower_cap_and_a_new_exit_code_are_changes(tmp_path):
    # Both runs re-judged by this kveval (results.json gets its decision: plain FAIL, remedy PASS, exit 4);
    # then B's remedy passes only up to 2048 and plain FP8 is undecided rather than failed.
    a, b = copy_run(H100_QWEN, tmp_path / "a"), copy_run(H100_QWEN, tmp_path / "b")
    for run in (a, b):
        assert CliRunner().invoke(cli, ["report", str(run)]).exit_code == 4

    def capped(results):
        deployment = results["deployment"]
        deployment["vllm_serve"] = deployment["vllm_serve"].replace("--max-model-len 8192", "--max-model-len 2048")
        deployment["max_model_len"] = results["decision"]["max_model_len"] = 2048
        results["decision"]["exit_code"] = 3

    edit(b, "results.json", capped)
    diff = diff_runs(a, b)
    assert diff.recommendation_changed and not diff.worse
    changed = {row.name: (row.a, row.b) for row in diff.recommendation if row.changed}
    assert changed == {"deploy command": (diff.recommendation[0].a, diff.recommendation[0].b),
                       "max-model-len cap": ("8192", "2048"), "exit code": ("4", "3")}
    assert "--max-model-len 2048" in changed["deploy command"][1]
    text = diff_markdown(diff)
    assert "Nothing got worse" not in text and "- exit code: `4` → `3`" in text
    assert "**The recommendation changed** (deploy command, max-model-len cap, exit code)" in text


# --- constructed pairs ----------------------------------------------------------------------------

@pytest.fixture
def pair(tmp_path):
    return copy_run(SMOLLM2_8192, tmp_path / "a"), copy_run(SMOLLM2_8192, tmp_path / "b")


def passed(results: dict) -> None:
    """The published run's fp8-8192 verdict (INCONCLUSIVE since the three-zone gate) set to PASS."""
    results["verdict"]["cells"]["fp8-8192"] = "PASS"
    results["verdict"]["status"] = "PASS"


def test_a_worse_verdict_exits_5(pair):
    a, b = pair
    edit(a, "results.json", passed)
    edit(b, "results.json", lambda r: r["verdict"]["cells"].update({"fp8-8192": "FAIL"}))
    result = run_cli(a, b)
    assert result.exit_code == EXIT_WORSE, result.output
    assert "fp8-8192: verdict PASS -> FAIL" in result.output
    # The other way round it got better: exit 0.
    assert run_cli(b, a).exit_code == 0


def test_pass_to_inconclusive_is_worse(pair):
    a, b = pair
    edit(a, "results.json", passed)                 # b keeps the published INCONCLUSIVE
    result = run_cli(a, b)
    assert result.exit_code == EXIT_WORSE, result.output
    assert "PASS → INCONCLUSIVE **worse**" in result.output
    assert run_cli(b, a).exit_code == 0


def test_inconclusive_to_fail_is_worse_and_fail_to_inconclusive_is_not(pair):
    a, b = pair
    edit(a, "results.json", lambda r: r["verdict"]["cells"].update({"fp8-8192": "INCONCLUSIVE"}))
    edit(b, "results.json", lambda r: r["verdict"]["cells"].update({"fp8-8192": "FAIL"}))
    assert diff_runs(a, b).worse and not diff_runs(b, a).worse


def test_a_kl_rise_beyond_noise_is_worse_and_one_within_noise_is_not(pair):
    a, b = pair
    floor = diff_runs(a, b).kl_noise_threshold
    assert floor == pytest.approx(0.00014269345757057182)   # the run's own noise floor (both runs alike)

    def raise_kl(by):
        def change(results):
            kv_comparison(results, "fp8-8192")["summary"]["kl_mean"] += by
        return change

    edit(b, "results.json", raise_kl(floor / 2))
    within = diff_runs(a, b).cells[0].divergence.kl_mean
    assert within.beyond_noise is False and not diff_runs(a, b).worse
    edit(b, "results.json", raise_kl(0.01))
    diff = diff_runs(a, b)
    kl = diff.cells[0].divergence.kl_mean
    assert kl.beyond_noise and kl.harmful and diff.worse
    assert any(w.startswith("KL mean") for w in diff.cells[0].why_worse)
    # The same change the other way (KL down) is beyond noise but not harmful.
    back = diff_runs(b, a).cells[0].divergence.kl_mean
    assert back.beyond_noise and not back.harmful


def test_a_run_without_a_noise_floor_uses_the_stated_default(pair):
    a, b = pair

    def no_floor(results):
        results["evidence"]["divergence"]["noise_floor"] = None
        results["verdict"]["noise_floor"] = None

    edit(a, "results.json", no_floor)
    edit(b, "results.json", no_floor)
    assert diff_runs(a, b).kl_noise_threshold == DEFAULT_KL_NOISE


def test_a_task_accuracy_drop_beyond_noise_is_worse(pair):
    a, b = pair
    edit(b, "results.json", lambda r: r["evidence"]["tasks"]["cells"]["fp8-8192"].update({"cell_accuracy": 0.1}))
    diff = diff_runs(a, b)
    tasks = diff.cells[0].tasks
    assert tasks.accuracy.harmful and tasks.ci_high < 0 and diff.worse
    assert run_cli(a, b).exit_code == EXIT_WORSE


def test_cells_of_one_run_only_are_listed(pair):
    a, b = pair

    def rename(results):
        results["verdict"]["cells"]["fp8-4096"] = results["verdict"]["cells"].pop("fp8-8192")

    edit(a, "results.json", passed)                 # each listed cell carries its own run's verdict
    edit(b, "results.json", rename)
    diff = diff_runs(a, b)
    assert not diff.cells and not diff.worse
    assert [(c.cell, c.verdict) for c in diff.only_in_a] == [("fp8-8192", "PASS")]
    assert [(c.cell, c.verdict) for c in diff.only_in_b] == [("fp8-4096", "INCONCLUSIVE")]
    text = diff_markdown(diff)
    assert "Only in A: fp8-8192 (PASS)." in text and "Only in B: fp8-4096 (INCONCLUSIVE)." in text


def test_runs_of_different_models_are_refused_in_one_line(pair):
    a, b = pair
    edit(b, "manifest.json", lambda m: m["model"].update({"name": "Another-Model"}))
    (b / "results.json").unlink()   # refused before anything else is read
    with pytest.raises(KvevalError, match="different models"):
        diff_runs(a, b)
    result = run_cli(a, b)
    assert result.exit_code == EXIT_USAGE
    assert "different models" in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1


@pytest.mark.parametrize("problem", ["missing", "not a run", "no results"])
def test_bad_inputs_are_one_line_usage_errors(tmp_path, problem):
    good = copy_run(SMOLLM2_8192, tmp_path / "good")
    bad = tmp_path / "bad"
    if problem != "missing":
        bad.mkdir()
    if problem == "no results":
        shutil.copy(good / "manifest.json", bad / "manifest.json")
    result = run_cli(good, bad)
    assert result.exit_code == EXIT_USAGE, result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1
    assert {"missing": "no such run directory", "not a run": "not a kveval run directory",
            "no results": "no results.json"}[problem] in result.output


def test_newcombe_interval_stays_possible():
    for counts in ((0, 162, 162, 162), (162, 162, 0, 162), (0, 10, 0, 10), (5, 5, 5, 5)):
        low, high = newcombe_interval(*counts)
        assert -1 <= low <= high <= 1
