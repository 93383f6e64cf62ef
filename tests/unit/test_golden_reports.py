"""Golden: every run directory under reports/ re-renders to the review and tables kveval wrote before
the restructuring (issue 9); results.json differs only as tests/golden/INTENDED_DIFFERENCES.md lists."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from kveval.cli.commands import cli
from kveval.files import schema
from kveval.files.rundir import RunDir, read_json
from kveval.gate import REASON_CODES
from kveval.render.review import LOG_LINE_START
from tests.support.golden import old_cpu_demo

ROOT = Path(__file__).resolve().parents[2]
REPORTS = ROOT / "reports"
GOLDEN = ROOT / "tests" / "golden"
RUN_DIRS = sorted(p.parent for p in REPORTS.rglob("manifest.json") if "archive" not in p.parts)
ARCHIVED = sorted(p.parent for p in (REPORTS / "archive").rglob("manifest.json"))
ADDED_EVIDENCE = {"acceptance", "sample_outputs", "speed_settings", "capacity_model", "throughput",
                  "attribution", "identical_specs", "quality_references", "timings", "timing_totals"}
# Gate limits added by issue 23 (INTENDED_DIFFERENCES.md): the review's thresholds line names them too.
ADDED_THRESHOLDS = {"attribution_min_reduction": 0.5, "defect_factor": 1.5}
ADDED_DEGENERATION_MARGIN = {"degeneration_noninferiority_margin": 0.05}  # issue 22; 0.05 since the three-zone gate (issue 40)


@pytest.fixture(autouse=True)
def no_figures(monkeypatch):
    """Review, tables and results.json are compared, the PNGs are not: not drawing them halves this
    module's CPU time (the copies keep the published PNGs; render/outputs.py NO_PLOTS_ENV)."""
    monkeypatch.setenv("KVEVAL_NO_PLOTS", "1")


def _rendered_copy(source: Path, tmp_path: Path) -> Path:
    copy = tmp_path / source.name
    shutil.copytree(source, copy)
    (copy / "review.md").unlink()
    outcome = CliRunner().invoke(cli, ["report", str(copy)])
    assert outcome.exit_code in (0, 1, 3, 4), outcome.output  # a verdict, not an error
    return copy


def test_every_published_report_is_covered():
    names = {str(p.relative_to(REPORTS)) for p in RUN_DIRS}
    assert {"cpu-demo", "h200-smollm2", "h200-planted-layers", "h200-qwen2.5-coder-1.5b",
            "h200-qwen2.5-coder-1.5b/keep-layers", "h200-sweep-smollm2-1gib"} <= names


@pytest.mark.parametrize("source", RUN_DIRS, ids=[str(p.relative_to(REPORTS)) for p in RUN_DIRS])
def test_report_re_renders_the_same_review_tables_and_results(source, tmp_path):
    copy = _rendered_copy(source, tmp_path)
    assert (copy / "review.md").read_text(encoding="utf-8") == (source / "review.md").read_text(encoding="utf-8")
    for table in sorted((source / "tables").glob("*.csv")):  # published reports keep the smaller tables
        assert (copy / "tables" / table.name).read_text(encoding="utf-8") == table.read_text(encoding="utf-8"), table.name
    stored, written = RunDir(source).results_path, RunDir(copy).results_path
    assert written.name == stored.name
    # A published results.json of the version before (2) is written back as the current one: the same
    # document as schema.upgrade reads it (issue 17: the KV spec's key is kv_spec).
    assert read_json(written) == schema.upgrade("results", read_json(stored))


def _without_added_lines(review: str) -> str:
    """The review less what issues 11, 23 and 38 added (INTENDED_DIFFERENCES.md): the line linking failed
    cells' logs, the new limits on the thresholds line, and the GGUF model's "Weights served" line."""
    added = "".join(f" {key}={value:g}" for key, value in ADDED_THRESHOLDS.items())
    margin = "".join(f" {key}={value:g}" for key, value in ADDED_DEGENERATION_MARGIN.items())
    kept = [line.replace(added, "").replace(margin, "") for line in review.split("\n")
            if not line.startswith(LOG_LINE_START) and not line.startswith("- **Weights served:**")]
    return "\n".join(kept).replace("\n\n\n", "\n\n").replace("char_run, unreadable_text, ", "char_run, ")


def _without_decision_table(review: str) -> str:
    """The review less the decision table under the headline (issue 19), with the per-cell verdict
    table it replaced put back where it stood (after the reasons), as the old review had it."""
    lines = review.split("\n")
    start = next(i for i, line in enumerate(lines) if line.startswith("| cell ") and "KV pool (× auto)" in line)
    end = next(i for i in range(start, len(lines)) if not lines[i].startswith("|"))
    rows = [line.split("|")[1:3] for line in lines[start + 2:end]]
    del lines[start:end + 1]
    if lines[start].startswith("Deploy"):   # the deploy line under it, also new (with `auto` when none passes)
        del lines[start:start + 2]
    rows = [(cell.strip(), status.strip().strip("*")) for cell, status in rows]
    width = max([len("cell")] + [len(cell) for cell, _ in rows])
    status_width = max([len("verdict")] + [len(status) for _, status in rows])
    verdicts = [f"| {'cell':<{width}} | {'verdict':<{status_width}} |", f"|:{'-' * (width + 1)}|:{'-' * (status_width + 1)}|"]
    verdicts += [f"| {cell:<{width}} | {status:<{status_width}} |" for cell, status in rows]
    at = next(i for i, line in enumerate(lines) if line.startswith("Divergence budgets:")) - 1
    lines[at:at] = ["", "Per tested cell:", "", *verdicts]
    return "\n".join(lines)


def _without_decision_lines(review: str) -> str:
    """The review less issue 41's second answer: the heading's "(`fp8` as asked)" and the line under it
    (deployable configuration and exit code), as the old review had the heading alone."""
    lines = review.split("\n")
    at = next(i for i, line in enumerate(lines) if line.startswith("## Verdict: "))
    lines[at] = re.sub(r" \(.* as asked\)$", "", lines[at])
    assert lines[at + 2].startswith("Deployable FP8 configuration: ") and lines[at + 3] == ""
    del lines[at + 2:at + 4]
    return "\n".join(lines)


def _without_timing_section(review: str) -> str:
    """The review less the "Where the time went" section (issue 18), which only a run re-read from its
    cells has (a published report's stored evidence holds no cell times)."""
    start = review.index("\n\n## Where the time went\n")
    return review[:start] + review[review.index("\n\n## ", start + 2):]


def _with_old_pool_lines(review: str) -> str:
    """The review with the start-up section's lines for a length where a cell did not start worded as
    before issue 19 labelled each figure measured or vLLM's estimate (INTENDED_DIFFERENCES.md)."""
    label = r"\((?:measured|vLLM's estimate)\)"
    return re.sub(r"- At max_model_len ([\d,]+) (?:a cell|cells) did not start, so this ratio rests on vLLM's estimate "
                  rf"\(([^)]*)\): (\S+) ([\d,]+) {label} vs (\S+) ([\d,]+) {label} tokens, ([\d.]+)×\.",
                  r"- At max_model_len \1 a cell did not start, but its pool is known from \2: \3 \4 vs \5 \6 tokens (\7×).",
                  review)


def _without_pool_token_columns(review: str) -> str:
    """The old review less the start-up per-length table's two token columns: their figures are stated once,
    in the per-cell table below it (issue 41; INTENDED_DIFFERENCES.md)."""
    lines, inside, drop = [], False, []
    for line in review.split("\n"):
        if line.startswith("| max_model_len ") and "| pool tokens " in line and "| ratio vs auto " in line:
            cells = line.strip("|").split("|")
            drop = [i for i, cell in enumerate(cells) if cell.strip() in ("auto pool tokens", "pool tokens")]
            inside = True
        elif not line.startswith("|"):
            inside = False
        if inside:
            cells = line.strip("|").split("|")
            line = "|" + "|".join(cell for i, cell in enumerate(cells) if i not in drop) + "|"
        lines.append(line)
    return "\n".join(lines)


def _without_baseline_column(review: str) -> str:
    """The review less the new-findings table's last column, the baseline's output (issue 22)."""
    lines, inside = [], False
    for line in review.split("\n"):
        inside = ("| auto's output" in line) or (inside and line.startswith("|"))
        lines.append(line.rstrip("|").rsplit("|", 1)[0] + "|" if inside else line)
    return "\n".join(lines)


NEW_DEGENERATION_WORDING = re.compile(r"A finding is new when the `auto` output for the same prompt does not show "
                                      r"the same detector\. The verdict counts outputs, not findings: [^\n]*")
OLD_DEGENERATION_WORDING = ("A finding counts against a cell only when the `auto` output for the same prompt does not "
                            "show the same detector.")


def _with_old_degeneration_wording(review: str) -> str:
    """The review with the degeneration section's sentence and per-cell table as before the paired count was
    spelled out (INTENDED_DIFFERENCES.md): `degenerate only here` read `new vs auto`, no `only in auto` column."""
    lines = NEW_DEGENERATION_WORDING.sub(OLD_DEGENERATION_WORDING, review).split("\n")
    start = next(i for i, line in enumerate(lines) if line.startswith("| cell ") and "| degenerate only here " in line)
    end = next(i for i in range(start, len(lines)) if not lines[i].startswith("|"))
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[start:end]]
    header, body = rows[0], rows[2:]
    drop = header.index("only in auto")
    header[header.index("degenerate only here")] = "new vs auto"
    kept = [[cell for i, cell in enumerate(row) if i != drop] for row in [header, *body]]
    # tabulate's pipe format: each column as wide as its widest cell, and at least its header plus 2
    widths = [max(len(kept[0][i]) + 2, *(len(row[i]) for row in kept[1:])) for i in range(len(kept[0]))]
    text = ["| " + " | ".join(f"{cell:<{w}}" for cell, w in zip(row, widths)) + " |" for row in kept]
    text.insert(1, "|" + "|".join(":" + "-" * (w + 1) for w in widths) + "|")
    lines[start:end] = text
    return "\n".join(lines)


_GATE_LINES = ("Divergence budgets:", "Thresholds:", "Every cell scored the same token sequences")


def _with_old_gate_lines(text: str, old: str) -> str:
    """The three-zone gate (2026-12-05) words the budgets, the thresholds and the divergence section's
    introduction anew and adds the divergence table's 'sequences (late)' column
    (INTENDED_DIFFERENCES.md): the old review's lines stand in for them."""
    before = {prefix: next(line for line in old.split("\n") if line.startswith(prefix)) for prefix in _GATE_LINES}
    lines = []
    for line in text.split("\n"):
        prefix = next((p for p in _GATE_LINES if line.startswith(p)), None)
        lines.append(before[prefix] if prefix else line)
    out, drop = [], False
    for line in lines:
        if line.startswith("| comparison ") and line.rstrip().endswith("sequences (late)   |"):
            drop = True
        elif not line.startswith("|"):
            drop = False
        out.append(line[:line.rstrip()[:-1].rstrip().rfind("|") + 1] if drop else line)
    return "\n".join(out)


def test_the_old_cpu_demo_re_renders_the_same_review_from_its_cells(tmp_path):
    # The complete run directory (cells included) that the code before issue 9 wrote and rendered.
    source = old_cpu_demo()
    copy = _rendered_copy(source, tmp_path)
    rendered = (copy / "review.md").read_text(encoding="utf-8")
    assert LOG_LINE_START + "[fp8-1024](cells/fp8-1024.log)" in rendered
    old = _without_pool_token_columns((source / "review.md").read_text(encoding="utf-8"))
    assert _with_old_gate_lines(_without_decision_table(_without_baseline_column(_without_added_lines(
        _with_old_pool_lines(_with_old_degeneration_wording(_without_timing_section(
            _without_decision_lines(rendered))))))), old) == old
    for table in sorted((source / "tables").glob("*.csv")):
        # speed.csv gains the noise columns, degeneration_summary.csv the paired test's baseline-only
        # count, degeneration_findings.csv the baseline's output (INTENDED_DIFFERENCES.md)
        if table.name == "degeneration_findings.csv":
            written = pd.read_csv(copy / "tables" / table.name)
            pd.testing.assert_frame_equal(written.drop(columns=["baseline_excerpt", "late"]), pd.read_csv(table))
        elif table.name not in ("speed.csv", "degeneration_summary.csv"):
            # Counts are integers now where pandas wrote 24.0 (issue 19): the same values.
            pd.testing.assert_frame_equal(pd.read_csv(copy / "tables" / table.name), pd.read_csv(table),
                                          check_dtype=False)


def test_results_differ_from_before_only_as_listed(tmp_path):
    copy = _rendered_copy(old_cpu_demo(), tmp_path)
    now = read_json(copy / "results.json")
    before = json.loads((old_cpu_demo() / "results.json").read_text(encoding="utf-8"))
    assert (before["schema_version"], now["schema_version"]) == (1, schema.RESULTS_VERSION) == (1, 3)
    # 2 -> 3 (issue 17) is what schema.upgrade does to a results.json of version 2: the KV spec's key is kv_spec
    before["schema_version"] = before["evidence"]["schema_version"] = 2
    schema.upgrade("results", before)
    assert set(now["evidence"]) - set(before["evidence"]) == ADDED_EVIDENCE
    assert set(before["evidence"]) <= set(now["evidence"])
    for document in (now, before):
        document.pop("schema_version")
        document["evidence"].pop("schema_version")
    for key in ADDED_EVIDENCE:
        now["evidence"].pop(key)
    assert (now["verdict"].pop("defects"), now["verdict"].pop("attributed")) == ([], {})
    for entry in now["evidence"]["degeneration"]["cells"].values():  # issue 22: the paired test's other side
        assert entry.pop("baseline_only_degenerate") in (None, 0)
    assert now["evidence"]["degeneration"]["detectors"].pop(5) == "unreadable_text"   # issue 23: a new detector
    for entry in now["evidence"]["degeneration"]["cells"].values():
        assert entry["detectors"].pop("unreadable_text") == 0
    for row in now["evidence"]["degeneration"]["findings"]:  # issue 22: the baseline's output beside a finding
        row.pop("baseline_excerpt")
        assert row.pop("late") is False                        # and whether it came after a capped answer
    for document in (now, before):  # issue 22: the degeneration check states its test
        for row in document["verdict"]["checks"]:
            if row["name"] == "new_degenerate_share":
                row.pop("detail")
    # Issue 40 (the three-zone gate): p99 and top-1 harm limits retired, harm limits at 1.5x the budget,
    # the task harm bar at the non-inferiority margin, the profile's calibration text rewritten.
    for retired in ("kl_p99_max", "kl_p99_fail", "top1_agreement_fail"):
        before["verdict"]["thresholds"].pop(retired)
        before["verdict"]["profile"]["budget"].pop(retired)
    # Since 2026-12-06 each CPU kind has its budget; this AVX2 CPU names no AMX, so `cpu` (0.05 / 0.08) replaces
    # the single CPU budget of the time (0.08 / 0.12), each harm limit 1.5x its budget.
    budget = now["verdict"]["profile"]["budget"]
    assert now["verdict"]["profile"]["name"] == before["verdict"]["profile"]["name"] == "cpu"
    assert (budget["kl_mean_max"], budget["kl_late_max"]) == (0.05, 0.08)
    for key in ("kl_mean", "kl_late"):
        assert budget[f"{key}_fail"] == pytest.approx(1.5 * budget[f"{key}_max"])
    before["verdict"]["profile"]["budget"] = budget
    assert now["evidence"]["platform"]["why"] == before["evidence"]["platform"]["why"] + ", no AMX"
    before["evidence"]["platform"]["why"] = now["evidence"]["platform"]["why"]
    assert (before["verdict"]["thresholds"]["task_recovery_min"], now["verdict"]["thresholds"]["task_recovery_min"]) \
        == (0.95, 0.9)
    before["verdict"]["thresholds"]["task_recovery_min"] = 0.9
    for key in ("why", "calibration"):
        before["verdict"]["profile"][key] = now["verdict"]["profile"][key]
    for key, value in {**ADDED_THRESHOLDS, **ADDED_DEGENERATION_MARGIN}.items():
        assert now["verdict"]["thresholds"].pop(key) == value
    for row in now["evidence"]["speed"]:
        assert {row.pop("ttft_vs_noise"), row.pop("decode_vs_noise")} <= {None, "beyond", "within", "too few runs"}
    for reason in now["verdict"]["reasons"]:  # issue 19: every reason names its finding
        assert reason.pop("code") in REASON_CODES
    # Issue 41: results.json carries the deploy answer, the review's own line word for word.
    deployment = now.pop("deployment")
    assert deployment["line"] in (copy / "review.md").read_text(encoding="utf-8")
    assert deployment["configuration"] is None and deployment["vllm_serve"] == "vllm serve MODEL --kv-cache-dtype auto"
    # Issue 41's exit codes: the run's two answers and its code; the old demo's verdict code is unchanged.
    decision = now.pop("decision")
    assert (decision["asked"], decision["deployable"], decision["configuration"]) == (before["verdict"]["status"],
                                                                                     "INCONCLUSIVE", None)
    assert decision["exit_code"] == decision["exit_code_require_any"] == now["verdict"]["exit_code"] == 3
    assert now == before


@pytest.mark.parametrize("source", ARCHIVED, ids=[str(p.relative_to(REPORTS)) for p in ARCHIVED])
def test_archived_reports_of_older_kveval_are_refused_by_file_and_field(source, tmp_path):
    copy = tmp_path / source.name
    shutil.copytree(source, copy)
    outcome = CliRunner().invoke(cli, ["report", str(copy)])
    assert outcome.exit_code == 2, outcome.output
    message = outcome.output
    assert "Traceback" not in message and ("manifest.json" in message or "results.json" in message)
    assert "field " in message or "schema_version" in message
