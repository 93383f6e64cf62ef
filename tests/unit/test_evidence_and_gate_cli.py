"""Evidence, results.json/CSVs, the verdict in review.md, and `kveval report` / `kveval gate` exit codes,
on constructed run directories (no engine)."""
from __future__ import annotations

import csv
import json
import re
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from kveval import api, defaults
from kveval.cli.commands import cli
from kveval.analysis.json_values import json_safe
from kveval.evidence import build_evidence
from kveval.files import schema
from kveval.gate import EXIT_FAIL, EXIT_INCONCLUSIVE, EXIT_PASS, EXIT_USAGE, Thresholds, evaluate
from tests.support.constructed import (DOCUMENTS, PROBES, expected_kl, failed_cell, planned_manifest, probe_records,
                                       probe_workloads, record, rejected, scoring_phase, started_cell, write_run)
from tests.support.evidence import typed_cells, typed_manifest

N = 700  # scored positions per document (DOCUMENTS of them): 200+ in all, 100+ from position 512 (the late half of 1024)
POSITIONS = DOCUMENTS * N   # 2100 scored positions per cell
OUTPUTS = 3 + PROBES        # judged generation outputs per cell: 3 prompts and the degeneration probes
CPU = Thresholds().budget("cpu")  # constructed cells ran on CPU_ATTN: the CPU profile applies
KL_MAX = f"{CPU.kl_mean_max:.2g}"                 # as the gate writes it, e.g. 0.08
KL_FAIL = f"{CPU.kl_mean_fail:.2g}"
TOP1_MIN = f"{100 * CPU.top1_agreement_min:.1f} %"

WORKLOADS = [
    {"id": "short_256-0", "workload": "short_256", "kind": "short", "token_ids": [1, 2, 3], "max_tokens": 64},
    {"id": "short_256-1", "workload": "short_256", "kind": "short", "token_ids": [1, 2, 4], "max_tokens": 64},
    {"id": "ctx_1k-0", "workload": "ctx_1k", "kind": "context", "token_ids": list(range(10, 60)), "max_tokens": 64},
    {"id": "over_1024-0", "workload": "over_1024", "kind": "over_limit", "token_ids": list(range(1025)),
     "max_tokens": 16},
] + probe_workloads()
AUTO_TEXTS = {
    "short_256-0": (list(range(100, 140)), "Paris is the capital of France. It lies on the Seine."),
    "short_256-1": (list(range(200, 230)), "Water boils at 100 degrees Celsius at sea level."),
    "ctx_1k-0": (list(range(300, 350)), "The document describes three experiments on caching."),
}
# The healthy fp8 cell parts from auto in short_256-1 at token 10, with text that would break markdown.
DIVERGING = (list(range(200, 210)) + list(range(900, 920)), "Water boils at 100 degrees | <b>Fahrenheit</b> `x` # no")
LOOP_IDS = [500, 501, 502, 503, 504] * 10
LOOP_TEXT = "The pass key is 42. " * 12


def _auto_records():
    return [record(pid, ids, text) for pid, (ids, text) in AUTO_TEXTS.items()] + [rejected("over_1024-0")] + probe_records()


def _fp8_records(kind):
    if kind == "harmed":
        outputs = {pid: (LOOP_IDS, LOOP_TEXT) for pid in AUTO_TEXTS}
    else:
        outputs = {**AUTO_TEXTS, "short_256-1": DIVERGING}
    return [record(pid, ids, text, finish="length" if kind == "harmed" else "stop")
            for pid, (ids, text) in outputs.items()] + [rejected("over_1024-0")] + probe_records()


def make_cells(kind):
    """kind: healthy | harmed | not_started (fp8 refused by the backend)."""
    auto = started_cell("auto", 1024, 1792, _auto_records(), scoring_phase(N, "same", noise_shape="same"))
    if kind == "not_started":
        fp8 = failed_cell("fp8", 1024)
    else:
        fp8 = started_cell("fp8", 1024, 3584, _fp8_records(kind), scoring_phase(N, kind), ttft=0.12, decode=40.0)
    return {"auto-1024": auto, "fp8-1024": fp8}


@pytest.fixture
def run_dir(tmp_path):
    def make(kind):
        path = tmp_path / kind
        write_run(path, WORKLOADS, make_cells(kind))
        return path
    return make


def _results(path):
    return json.loads((path / "results.json").read_text())


def _csv(path, name):
    with open(path / "tables" / f"{name}.csv", newline="") as handle:
        return list(csv.DictReader(handle))


def _flat(text):
    """Markdown with table padding collapsed, so rows can be matched without column widths."""
    return re.sub(r" {2,}", " ", text)


def _kv(results, cell="fp8-1024"):
    (comp,) = [c for c in results["evidence"]["divergence"]["comparisons"] if c["kind"] == "kv" and c["cell"] == cell]
    return comp


# --- evidence (pure) -------------------------------------------------------------------------------

def test_evidence_has_the_gate_shape_and_is_json():
    cells = make_cells("harmed")
    evidence = build_evidence(typed_manifest({}), WORKLOADS, typed_cells(cells))
    json.dumps(schema.dump(evidence), allow_nan=False)
    assert schema.dump(evidence.cells["fp8-1024"]) == {"kv_spec": "fp8", "max_model_len": 1024, "started": True,
                                                       "failure_reason": None, "kv_pool_tokens": 3584}
    fp8 = evidence.degeneration.cells["fp8-1024"]
    assert (fp8.outputs, fp8.new_degenerate, fp8.judged_outputs) == (OUTPUTS, 3, OUTPUTS)
    assert fp8.detectors["ngram_loop_tokens"] == 3 and fp8.token_limit_rate == pytest.approx(3 / OUTPUTS)
    assert evidence.degeneration.cells["auto-1024"].new_degenerate == 0
    assert evidence.divergence.top_k == [5]
    verdict = evaluate(evidence)
    assert verdict.status == "FAIL"
    # The KL mean and the late KL mean are the FAIL paths; top-1 agreement (0 %) is only not shown healthy.
    assert {c.name for c in verdict.checks if c.passed is False} == {"kl_mean", "kl_late_mean"}
    assert [c.passed for c in verdict.checks if c.name == "top1_agreement"] == [None]
    # 3 of 63 outputs loop only in FP8 (the three prompts, not the probes): McNemar exact p 0.125, too few
    # to decide (issue 22).
    assert [c.passed for c in verdict.checks if c.name == "degeneration_noninferiority"] == [None]
    assert evidence.platform.profile == "cpu" and evidence.tasks_planned is False


def test_one_scored_document_gives_no_interval_and_no_verdict_on_divergence():
    # The harmed cell (KL 1.52) with one scored document: its 700 positions are one unit of evidence, so
    # the divergence has no interval: neither PASS nor FAIL, and the gate says what would decide it.
    cells = make_cells("harmed")
    for facts in cells.values():
        scoring = facts["phases"]["scoring"]
        scoring["sequences"] = scoring["sequences"][:1]
        if "noise" in scoring:
            scoring["noise"]["sequences"] = scoring["noise"]["sequences"][:1]
    evidence = build_evidence(typed_manifest({}), WORKLOADS, typed_cells(cells))
    (comp,) = [c for c in evidence.divergence.comparisons if c.kind == "kv"]
    assert comp.clustered["kl_mean"].clusters == 1 and comp.clustered["kl_mean"].se is None
    verdict = evaluate(evidence)
    assert verdict.status == "INCONCLUSIVE" and not [r for r in verdict.reasons if r.level == "FAIL"]
    (reason,) = [r for r in verdict.reasons if r.code == "divergence_undecided"]
    assert "KL mean 1.52 rests on 1 scored sequence: no interval" in reason.message
    assert "more scored documents" in reason.decide


def test_json_safe_replaces_nan_and_numpy():
    import numpy as np
    import pandas as pd

    assert json_safe({"a": float("nan"), "b": np.int64(3), "c": (np.float32(0.5), pd.NA), "d": np.bool_(True)}) == \
        {"a": None, "b": 3, "c": [0.5, None], "d": True}


# --- report / gate on disk -------------------------------------------------------------------------

def test_healthy_run_passes_with_every_figure_stored(run_dir):
    path = run_dir("healthy")
    result = CliRunner().invoke(cli, ["report", str(path)])
    assert result.exit_code == EXIT_PASS, result.output
    assert str(path / "review.md") in result.stdout
    results = _results(path)
    assert results["schema_version"] == results["evidence"]["schema_version"] == 3
    assert results["verdict"]["status"] == "PASS" and results["verdict"]["exit_code"] == 0
    summary = _kv(results)["summary"]
    assert summary["n"] == POSITIONS
    clustered = _kv(results)["clustered"]
    assert clustered["kl_mean"]["clusters"] == DOCUMENTS and clustered["kl_mean"]["positions"] == POSITIONS
    assert clustered["kl_mean"]["estimate"] == pytest.approx(expected_kl("healthy"), rel=1e-9)
    assert clustered["kl_mean"]["se"] == pytest.approx(0, abs=1e-12)  # identical documents
    assert clustered["kl_late_mean"]["positions"] == DOCUMENTS * (N - 511)
    assert summary["kl_mean"] == pytest.approx(expected_kl("healthy"), rel=1e-9)
    assert summary["kl_mean"] == pytest.approx(3.26e-4, abs=1e-6)
    assert summary["top1_agreement"] == 1.0
    assert summary["abs_dp_mean"] == pytest.approx(0.01)
    floor = results["evidence"]["divergence"]["noise_floor"]
    assert floor["kl_mean"] == 0.0 and floor["source"][0]["kind"] == "noise_batch"
    (row,) = [r for r in results["evidence"]["diff"]["summary"] if r["workload"] == "short_256"]
    assert (row["identical"], row["compared"], row["exact_match_rate"]) == (1, 2, 0.5)
    assert row["earliest_divergence"] == 10

    pairs = _csv(path, "diff_pairs")
    assert len(pairs) == OUTPUTS
    assert {p["prompt"] for p in pairs} - {f"probe-{i}" for i in range(PROBES)} == {"short_256-0", "short_256-1", "ctx_1k-0"}
    divergence = _csv(path, "divergence")
    assert [(r["kind"], r["bucket"]) for r in divergence] == [
        ("kv", "all"), ("kv", "0-127"), ("kv", "128-255"), ("kv", "256-511"), ("kv", "512-1023"),
        ("noise_batch", "all"), ("noise_batch", "0-127"), ("noise_batch", "128-255"), ("noise_batch", "256-511"),
        ("noise_batch", "512-1023")]
    assert _kv(results)["late"]["start"] == 512 and _kv(results)["late"]["n"] == DOCUMENTS * (N - 511)
    assert float(divergence[0]["kl_mean"]) == pytest.approx(expected_kl("healthy"))
    assert int(divergence[1]["n"]) == DOCUMENTS * 127  # positions 1..127 of each document
    assert [r["cell"] for r in _csv(path, "startup")] == ["auto-1024", "fp8-1024"]
    speed = {r["cell"]: r for r in _csv(path, "speed")}
    assert float(speed["fp8-1024"]["ttft_delta_pct"]) == pytest.approx(20.0)
    assert {r["name"] for r in _csv(path, "checks")} == {"kl_mean", "kl_late_mean", "top1_agreement",
                                                         "degeneration_noninferiority"}
    assert results["verdict"]["cells"] == {"fp8-1024": "PASS"}


def test_review_leads_with_the_verdict_and_escapes_the_excerpt(run_dir):
    path = run_dir("healthy")
    assert CliRunner().invoke(cli, ["report", str(path)]).exit_code == EXIT_PASS
    review = _flat((path / "review.md").read_text())
    lines = review.splitlines()
    assert lines[0] == "# kveval review — m"
    assert lines[2] == "## Verdict: **PASS** (`fp8` as asked)"
    assert lines[4] == ("Deployable FP8 configuration: **PASS** (`fp8` up to --max-model-len 1024) · exit code 0: "
                        "deployable as asked")
    order = [review.index(h) for h in ("## Verdict", "## Run", "## Start-up", "## Output diff vs `auto`",
                                       "## Degeneration", "## Teacher-forced divergence")]
    assert order == sorted(order)
    # Divergence's PASS bounds are at alpha / 5 = 0.01 (99 %), as is each FAIL path's (fail_alpha = 0.01);
    # degeneration's PASS bound stays at alpha (95 %).
    assert Thresholds().divergence_pass_alpha == pytest.approx(0.01) == Thresholds().fail_alpha
    assert (f"- fp8-1024: KL mean excess over the noise floor 0.00033 on {DOCUMENTS} sequences ({POSITIONS} positions), "
            f"99 % upper bound 0.00033 vs healthy budget {KL_MAX}, 99 % lower bound 0.00033 vs harm limit {KL_FAIL}; "
            f"KL mean (late) excess over the noise floor 0.00033 on {DOCUMENTS} sequences") in review
    assert (f"top-1 agreement 100.0 %, 99 % one-sided bound 100.0 % vs minimum {TOP1_MIN}, n {POSITIONS}, {DOCUMENTS} "
            f"sequences; degeneration excess upper bound 4.1 % < 5.0 % (0 of {OUTPUTS} outputs degenerate only here, "
            "0 only in auto") in review
    assert "**FP8 passes at 1024 and holds 2× the `auto` pool.**" in review
    assert "long-context task accuracy not measured (tasks turned off)" in review
    assert "Divergence budgets: **cpu profile**" in review
    assert f"Noise floor (auto vs itself, worst of: auto-1024 re-scored in another batch (n {POSITIONS:,}))" in review
    # Output diff: per workload, the first diverging pair side by side, escaped.
    assert f"**{OUTPUTS - 1} of {OUTPUTS}** outputs identical." in review
    assert "| short\\_256 | fp8-1024 | auto-1024 | 1/2 | 50.0 %" in review
    assert "first differing token 10" in review
    assert "| fp8-1024 | Water boils at 100 degrees ▸ \\| &lt;b&gt;Fahrenheit&lt;/b&gt; \\`x\\` \\# no |" in review
    assert "| auto-1024 | Water boils at 100 degrees ▸ Celsius at sea level." in review
    assert "<b>" not in review
    # Degeneration: nothing fired, said so; token-limit share per cell.
    assert "Nothing new: no detector fired" in review
    assert "None: no detector fired on any output, the baseline's included." in review
    # Divergence: k stated, noise floor beside.
    assert "reference top-k (k=5) plus a rest bucket" in review
    assert f"| fp8-1024 vs auto-1024 | KV dtype | {POSITIONS:,} | 0.000326" in review
    assert "**noise floor** (worst noise row)" in review
    assert "### By position" in review and "| 512-1023 " in review
    for line in lines:
        if line.startswith("|"):
            assert line.rstrip().endswith("|"), line


def test_harmed_run_fails_with_reasons_and_loop_findings(run_dir):
    path = run_dir("harmed")
    runner = CliRunner()
    result = runner.invoke(cli, ["gate", str(path)])
    assert result.exit_code == EXIT_FAIL, result.output
    out = result.stdout.splitlines()
    assert out[0] == "FAIL"
    kl_reason = (f"fp8-1024: divergence vs auto-1024 shown beyond the harm limit: KL mean 1.52, lower bound 1.52 > "
                 f"harm limit {KL_FAIL} ({DOCUMENTS} sequences)")
    assert any(line.startswith(f"- {kl_reason}") for line in out), out
    assert any(f"KL mean at positions ≥ 512 1.52, lower bound 1.52 > harm limit {CPU.kl_late_fail:g}" in line
               for line in out), out
    # Three looping outputs of 63 are not shown harmful (issue 22): the excess is undecided, not a FAIL.
    assert any(f"fp8-1024: 3 of {OUTPUTS} outputs degenerate where the auto output does not, 0 the other way: the "
               "excess is neither shown under 5.0 % nor above 5.0 %" in line for line in out), out
    assert f"results: {path / 'results.json'}" in out
    assert runner.invoke(cli, ["report", str(path)]).exit_code == EXIT_FAIL

    results = _results(path)
    assert results["verdict"]["status"] == "FAIL"
    assert _kv(results)["summary"]["kl_mean"] == pytest.approx(expected_kl("harmed"))
    assert _kv(results)["summary"]["top1_agreement"] == 0.0
    findings = _csv(path, "degeneration_findings")
    loops = [f for f in findings if f["detector"] == "ngram_loop_tokens"]
    assert len(loops) == 3 and all(f["new_vs_baseline"] == "True" and f["cell"] == "fp8-1024" for f in loops)
    assert all(f["baseline_cell"] == "auto-1024" for f in loops)

    review = _flat((path / "review.md").read_text())
    assert review.index("## Verdict: **FAIL**") < review.index("## Run")
    assert f"- {kl_reason}" in review
    assert "**FP8 fails at 1024.**" in review
    assert "### New in non-`auto` cells" in review
    new_table = review[review.index("### New in non-`auto` cells"):review.index("### Already in the baseline")]
    assert "| fp8-1024 | short\\_256 | short\\_256-0 | ngram\\_loop\\_tokens" not in new_table  # detector names are ours
    assert "| ngram_loop_tokens |" in new_table and "The pass key is 42." in new_table
    assert "Nothing new" not in review
    assert f"| fp8-1024 | {OUTPUTS} | 3 | 3 | 0 | ngram_loop_tokens 3, ngram_loop_chars 3 | 4.8 % |" in review
    # fp8 stopped at the token limit on each of its 3 looping outputs (3 of 63), on no probe


def test_no_fp8_cell_started_is_inconclusive(run_dir):
    path = run_dir("not_started")
    runner = CliRunner()
    result = runner.invoke(cli, ["gate", str(path)])
    assert result.exit_code == EXIT_INCONCLUSIVE, result.output
    assert result.stdout.splitlines()[0] == "INCONCLUSIVE"
    assert "- no tested cell started: quality could not be measured" in result.stdout
    assert runner.invoke(cli, ["report", str(path)]).exit_code == EXIT_INCONCLUSIVE
    review = (path / "review.md").read_text()
    assert "## Verdict: **INCONCLUSIVE**" in review
    assert "- no tested cell started: quality could not be measured" in review
    assert "**FP8 did not start at 1024.**" in review
    assert "fp8-1024: not compared (did not start)" in review
    assert "Nothing to scan: no non-`auto` cell produced an output." in review
    assert _results(path)["verdict"]["exit_code"] == EXIT_INCONCLUSIVE


def test_report_is_reproducible(run_dir):
    path = run_dir("harmed")
    CliRunner().invoke(cli, ["report", str(path)])
    first = ((path / "review.md").read_text(), (path / "results.json").read_text())
    (path / "review.md").unlink()
    CliRunner().invoke(cli, ["report", str(path)])
    assert ((path / "review.md").read_text(), (path / "results.json").read_text()) == first


# --- thresholds ------------------------------------------------------------------------------------

LOOSE = ("kl_mean_max: 5\nkl_late_max: 5\ntop1_agreement_min: 0\nmax_new_degenerate_share: 1\n"
         "degeneration_noninferiority_margin: 1\nkl_mean_fail: 9\nkl_late_fail: 9\n")


def test_yaml_config_and_threshold_overrides(run_dir, tmp_path):
    harmed, healthy = run_dir("harmed"), run_dir("healthy")
    config = tmp_path / "gate.yaml"
    config.write_text(LOOSE)
    runner = CliRunner()
    result = runner.invoke(cli, ["gate", str(harmed), "--gate-config", str(config)])
    assert result.exit_code == EXIT_PASS, result.output
    assert _results(harmed)["verdict"]["thresholds"]["kl_mean_max"] == 5.0
    assert "kl_mean_max=5 kl_late_max=5 top1_agreement_min=0 kl_mean_fail=9" in (harmed / "review.md").read_text()
    # --threshold wins over the file.
    result = runner.invoke(cli, ["gate", str(harmed), "--gate-config", str(config), "--threshold", "kl_mean_max=0.01"])
    assert result.exit_code == EXIT_INCONCLUSIVE
    assert ("KL mean 1.52 is shown between the healthy budget 0.01 and the harm limit 9 (lower bound 1.52"
            in result.stdout)
    result = runner.invoke(cli, ["gate", str(harmed), "--gate-config", str(config), "--threshold", "kl_mean_fail=0.5",
                                 "--threshold", "kl_mean_max=0.1"])
    assert result.exit_code == EXIT_FAIL and "KL mean 1.52, lower bound 1.52 > harm limit 0.5" in result.stdout
    # A --threshold that makes the zones overlap is a usage error, not a verdict.
    result = runner.invoke(cli, ["gate", str(harmed), "--gate-config", str(config), "--threshold", "kl_mean_fail=4"])
    assert result.exit_code == EXIT_USAGE and "kl_mean_fail 4 is under kl_mean_max 5" in result.output
    # A stricter limit moves the healthy run out of PASS; report takes the same options.
    result = runner.invoke(cli, ["report", str(healthy), "--threshold", "kl_mean_max=0.0001", "--threshold",
                                 "top1_agreement_min=0.5"])
    assert result.exit_code == EXIT_INCONCLUSIVE
    thresholds = _results(healthy)["verdict"]["thresholds"]
    assert (thresholds["kl_mean_max"], thresholds["top1_agreement_min"]) == (0.0001, 0.5)


@pytest.mark.parametrize("args, fragment", [
    (["--threshold", "bogus=1"], "unknown threshold 'bogus'"),
    (["--threshold", "kl_mean_max=abc"], "kl_mean_max must be a number"),
    (["--threshold", "top1_agreement_min=2"], "must lie in [0, 1]"),
    (["--threshold", "kl_mean_max"], "not of the form KEY=VALUE"),
    (["--gate-config", "missing.yaml"], "cannot read thresholds file"),
])
def test_bad_thresholds_are_usage_errors(run_dir, args, fragment):
    path = run_dir("healthy")
    for command in ("gate", "report"):
        result = CliRunner().invoke(cli, [command, str(path), *args])
        assert result.exit_code == EXIT_USAGE, result.output
        assert fragment in result.output and "Traceback" not in result.output
    assert not (path / "results.json").exists()


def test_bad_yaml_and_missing_run_dir_are_usage_errors(run_dir, tmp_path):
    path = run_dir("healthy")
    bad = tmp_path / "bad.yaml"
    bad.write_text("kl_mean_max: [unclosed\n")
    result = CliRunner().invoke(cli, ["gate", str(path), "--gate-config", str(bad)])
    assert result.exit_code == EXIT_USAGE and "not valid YAML" in result.output
    bad.write_text("- 1\n- 2\n")
    result = CliRunner().invoke(cli, ["gate", str(path), "--gate-config", str(bad)])
    assert result.exit_code == EXIT_USAGE and "expected a mapping" in result.output
    result = CliRunner().invoke(cli, ["gate", str(tmp_path / "nope")])
    assert result.exit_code == EXIT_USAGE and "no such run directory" in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_compare_checks_thresholds_before_any_engine(tmp_path):
    result = CliRunner().invoke(cli, ["compare", "--out", str(tmp_path / "o"), "--threshold", "bogus=1"])
    assert result.exit_code == EXIT_USAGE and "unknown threshold 'bogus'" in result.output
    assert not (tmp_path / "o").exists()


def test_compare_exits_with_the_verdict_and_passes_thresholds(run_dir, monkeypatch, tmp_path):
    path = run_dir("harmed")
    seen = {}

    def fake_compare(**kwargs):
        seen.update(kwargs)
        return api.report(path, gate_config=kwargs["gate_config"], gate_overrides=kwargs["gate_overrides"])

    monkeypatch.setattr(api, "compare", fake_compare)
    result = CliRunner().invoke(cli, ["compare", "--out", str(path)])
    assert result.exit_code == EXIT_FAIL and str(path / "review.md") in result.stdout
    # What the CLI hands the API with every option left at its default must pass the API's own checks.
    options = api.compare_options(**seen)
    assert options.max_model_len == defaults.MAX_MODEL_LEN and not options.lengths_given
    assert options.concurrency is None   # left out: not handed to the API, whose default is the suite's levels
    CliRunner().invoke(cli, ["compare", "--out", str(path), "--concurrency", "1", "8"])
    assert seen["concurrency"] == (1, 8) or list(seen["concurrency"]) == [1, 8]
    config = tmp_path / "gate.yaml"
    config.write_text(LOOSE)
    result = CliRunner().invoke(cli, ["compare", "--out", str(path), "--gate-config", str(config),
                                      "--threshold", "alpha=0.01"])
    assert result.exit_code == EXIT_PASS, result.output
    assert seen["gate_config"] == str(config) and seen["gate_overrides"] == {"alpha": "0.01"}


def test_interrupted_compare_exits_130(monkeypatch, tmp_path):
    def interrupted(**kwargs):
        raise api.RunInterrupted(tmp_path)

    monkeypatch.setattr(api, "compare", interrupted)
    result = CliRunner().invoke(cli, ["compare", "--out", str(tmp_path / "o")])
    assert result.exit_code == 130 and "interrupted" in result.output


# --- Python API ------------------------------------------------------------------------------------

def test_api_report_and_gate(run_dir):
    path = run_dir("harmed")
    result = api.report(path)
    assert result.verdict.status == "FAIL" and result.evidence.cells["fp8-1024"].started
    assert result.results_path == path / "results.json" and result.review_path == path / "review.md"
    verdict = api.gate(path, gate_overrides={"kl_mean_max": 5, "kl_late_max": 5, "top1_agreement_min": 0,
                                             "max_new_degenerate_share": 1, "degeneration_noninferiority_margin": 1,
                                             "kl_mean_fail": 9, "kl_late_fail": 9})
    assert verdict.status == "PASS"
    assert _results(path)["verdict"]["status"] == "PASS"
    with pytest.raises(api.KvevalError, match="unknown threshold"):
        api.gate(path, gate_overrides={"nope": 1})
    # Retired limits (KL p99, top-1 harm) are no longer gated: naming one is an unknown threshold.
    with pytest.raises(api.KvevalError, match="unknown threshold 'kl_p99_max'"):
        api.gate(path, gate_overrides={"kl_p99_max": 5})
    with pytest.raises(api.KvevalError, match="task_recovery_min 0.95 is above task_noninferiority_margin 0.9"):
        api.gate(path, gate_overrides={"task_recovery_min": 0.95})


def test_run_with_no_cell_results_yet_is_inconclusive_not_a_crash(tmp_path):
    from kveval.files.rundir import RunDir, write_json_atomic

    store = RunDir(tmp_path / "r")
    write_json_atomic(store.manifest_path, planned_manifest([{"id": "auto-1024", "kv_spec": "auto", "max_model_len": 1024},
                                                             {"id": "fp8-1024", "kv_spec": "fp8", "max_model_len": 1024}]))
    result = CliRunner().invoke(cli, ["gate", str(store.path)])
    assert result.exit_code == EXIT_INCONCLUSIVE, result.output
    review = store.review_path.read_text()
    assert "## Verdict: **INCONCLUSIVE**" in review and "_No cell has a result yet._" in review
    cells = _results(store.path)["evidence"]["cells"]
    assert {name for name, cell in cells.items() if cell["missing"]} == {"auto-1024", "fp8-1024"}
    assert "fp8-1024: planned but has no result file" in result.stdout


def test_deleted_cell_file_is_named_and_never_pass(run_dir):
    path = run_dir("healthy")
    assert CliRunner().invoke(cli, ["gate", str(path)]).exit_code == EXIT_PASS
    (path / "cells" / "fp8-1024.json").unlink()
    result = CliRunner().invoke(cli, ["gate", str(path)])
    assert result.exit_code == EXIT_INCONCLUSIVE, result.output
    assert "fp8-1024: planned but has no result file" in result.stdout
    assert "run the same command again with the same --out" in (path / "review.md").read_text()


def test_vllms_own_option_names_are_aliases(run_dir, monkeypatch):
    # --kv-cache-dtype and --kv-cache-memory-bytes, as vLLM spells them, mean --kv and --kv-cache-memory.
    path = run_dir("harmed")
    seen = {}

    def fake_compare(**kwargs):
        seen.update(kwargs)
        return api.report(path)

    monkeypatch.setattr(api, "compare", fake_compare)
    CliRunner().invoke(cli, ["compare", "--out", str(path), "--kv-cache-dtype", "fp8:keep=0", "auto",
                             "--kv-cache-memory-bytes", "157286400"])
    assert list(seen["kv"]) == ["fp8:keep=0", "auto"] and seen["kv_cache_memory"] == "157286400"
    options = api.compare_options(**seen)
    assert [spec.text for spec in options.kv_specs] == ["fp8:keep=0", "auto"]


def test_gate_json_gives_the_verdict_with_reason_codes_and_writes_nothing(run_dir):
    path = run_dir("harmed")
    before = {p: p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}
    result = CliRunner().invoke(cli, ["gate", str(path), "--json"])
    assert result.exit_code == EXIT_FAIL, result.output
    document = json.loads(result.stdout)
    assert document["verdict"] == "FAIL" and document["exit_code"] == EXIT_FAIL
    assert document["cells"] == {"fp8-1024": "FAIL"}
    codes = {(r["code"], r["level"]) for r in document["reasons"]}
    assert ("divergence_harm", "FAIL") in codes and ("degeneration_undecided", "INCONCLUSIVE") in codes
    assert {p: p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()} == before
    # The written verdict carries the same codes.
    assert CliRunner().invoke(cli, ["gate", str(path)]).exit_code == EXIT_FAIL
    assert [r["code"] for r in _results(path)["verdict"]["reasons"]] == [r["code"] for r in document["reasons"]]


def test_every_reason_the_gate_gives_has_a_listed_code():
    import re
    from pathlib import Path

    import kveval.gate
    from kveval.gate import REASON_CODES

    sources = "".join(p.read_text(encoding="utf-8") for p in Path(kveval.gate.__file__).parent.glob("*.py"))
    used = set(re.findall(r'code="([a-z_]+)"', sources))
    assert used == set(REASON_CODES)
    assert sources.count("out.reason(") == len(re.findall(r'code="[a-z_]+"', sources))


def test_vllms_engine_options_reach_the_engine_and_kvevals_loaders(run_dir, monkeypatch, tmp_path):
    from kveval.inputs.model_config import ModelSource
    from kveval.run import diagnosis
    from kveval.files.rundir import RunDir

    path = run_dir("harmed")
    seen = {}
    monkeypatch.setattr(api, "compare", lambda **kwargs: seen.update(kwargs) or api.report(path))
    CliRunner().invoke(cli, ["compare", "--out", str(path), "--revision", "v2", "--tokenizer", "tok-dir",
                             "--trust-remote-code", "--tensor-parallel-size", "2", "--max-num-seqs", "8",
                             "--dtype", "float16", "--attention-backend", "TRITON_ATTN", "--engine-arg", "seed=1"])
    assert seen["engine_args"] == {"seed": 1, "revision": "v2", "tokenizer": "tok-dir", "trust_remote_code": True,
                                   "tensor_parallel_size": 2, "max_num_seqs": 8, "dtype": "float16",
                                   "attention_backend": "TRITON_ATTN"}
    # kveval's own loaders read what vLLM loads: the tokenizer, the revision, remote code.
    source = ModelSource.of("org/model", seen["engine_args"])
    assert (source.revision, source.tokenizer, source.trust_remote_code) == ("v2", "tok-dir", True)
    commands = []

    class Done:
        returncode, stdout, stderr = 1, "", "stopped by the test"

    monkeypatch.setattr(diagnosis.subprocess, "run", lambda command, **_: commands.append(command) or Done())
    diagnosis.run_diagnosis(RunDir(tmp_path / "d"), source, None, SimpleNamespace(note=lambda m: None))
    assert commands[0][commands[0].index("--revision") + 1] == "v2" and "--trust-remote-code" in commands[0]
    result = CliRunner().invoke(cli, ["compare", "--out", str(path), "--dtype", "half", "--engine-arg", "dtype=half"])
    assert result.exit_code == EXIT_USAGE and "--dtype and --engine-arg dtype=... both given" in result.output


def test_the_tokenizer_vllm_uses_is_the_one_kveval_loads(default_model_dir):
    from kveval.inputs.model_config import ModelSource, load_tokenizer

    own = load_tokenizer(ModelSource(path=str(default_model_dir)))
    other = load_tokenizer(ModelSource(path="/no/such/model", tokenizer=str(default_model_dir)))
    assert other("kv cache")["input_ids"] == own("kv cache")["input_ids"]
    with pytest.raises(api.KvevalError, match="revision nope"):
        load_tokenizer(ModelSource(path="/no/such/model", revision="nope"))
