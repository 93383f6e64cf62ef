"""A review never says two things about one fact. Each test guards an inconsistency found in published
reviews (issue 19) on every published review and on a constructed run:

- the KV pool: every pool figure stated for a cell is the measured one (`capacity.kv_pool_tokens`, in the
  evidence as each cell's `kv_pool_tokens`), unless it is labelled as vLLM's estimate or kveval's
  prediction (the CPU demo once said "1,664 vs 3,584 tokens (2.15×)" beside the measured 1,792, 2.00×);
- a recovery's lower bound is never negative (a review once printed "−5.6 %"), and a recovery stated to
  sit at or under the margin is never followed by the sample count that would show it non-inferior;
- the README's "Reading the review" promises sections that the published reviews have;
- reports/README.md says what the planner does for the Qwen review as that review's remedy text does.
"""
from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest

from kveval.evidence import build_evidence
from kveval.files import schema
from kveval.files.rundir import RunDir
from kveval.gate import evaluate
from kveval.render.review import render_review
from kveval.run.remedy import plan_remedy
from tests.support.constructed import TEMPLATE_MANIFEST, complete_cells, failed_cell, planned_manifest, started_cell
from tests.support.evidence import typed_cells, typed_manifest
from tests.unit.test_gate import evidence as gate_evidence

ROOT = Path(__file__).resolve().parents[2]
REPORTS = ROOT / "reports"
RUN_DIRS = sorted(p.parent for p in REPORTS.rglob("manifest.json") if "archive" not in p.parts)
IDS = [str(p.relative_to(REPORTS)) for p in RUN_DIRS]
ESTIMATE = "vLLM's estimate"


def _published(run_dir: Path) -> tuple[str, schema.Evidence, schema.Manifest]:
    store = RunDir(run_dir)
    return (run_dir / "review.md").read_text(encoding="utf-8"), store.results().evidence, store.manifest()


def _int(text: str) -> int:
    return int(text.replace(",", ""))


def _tables(review: str) -> list[tuple[list[str], list[dict[str, str]]]]:
    """Every pipe table of the review: its column names and its rows, by column."""
    tables, block = [], []
    for line in [*review.split("\n"), ""]:
        if line.startswith("|"):
            block.append([cell.strip() for cell in re.split(r"(?<!\\)\|", line)[1:-1]])
            continue
        if len(block) >= 2:
            tables.append((block[0], [dict(zip(block[0], row)) for row in block[2:]]))
        block = []
    return tables


# --- the KV pool ------------------------------------------------------------------------------------

class Pools:
    """The measured pools of a run's evidence: per cell, and per (KV configuration, max_model_len) of the
    cells that are no quality reference (whose pool is no capacity figure)."""

    def __init__(self, evidence: schema.Evidence):
        self.baseline = evidence.baseline_kv
        self.lengths = {name: cell.max_model_len for name, cell in evidence.cells.items()}
        self.cell = {name: cell.kv_pool_tokens for name, cell in evidence.cells.items()
                     if cell.started and cell.kv_pool_tokens}
        self.by_kv = {(cell.kv_spec, cell.max_model_len): cell.kv_pool_tokens
                      for cell in evidence.cells.values()
                      if cell.started and cell.kv_pool_tokens and cell.reference_for is None}

    def ratio(self, kv: str, length: int) -> str:
        return f"{self.by_kv[(kv, length)] / self.by_kv[(self.baseline, length)]:.2f}"


def _check_tables(review: str, pools: Pools) -> int:
    """Every pool figure in the review's tables against the measured pools; how many were checked."""
    checked = 0
    for columns, rows in _tables(review):
        for row in rows:
            if "KV pool (× auto)" in columns:      # the decision table
                found = re.match(r"([\d,]+) tokens(?: = ([\d.]+)× \w+)?;", row["KV pool (× auto)"])
                cell = row["cell"]
                if found is None:
                    assert cell not in pools.cell, (cell, row)
                    continue
                length = pools.lengths[cell]
                assert _int(found[1]) == pools.cell[cell], (cell, row)
                kv = next(kv for (kv, n), tokens in pools.by_kv.items() if n == length and tokens == pools.cell[cell])
                assert found[2] == (pools.ratio(kv, length) if (pools.baseline, length) in pools.by_kv else None), row
                checked += 1
            elif "cell" in columns and ("KV pool tokens" in columns or "measured tokens" in columns):
                # start-up per cell, and the capacity table's measured column
                value = row.get("KV pool tokens", row.get("measured tokens"))
                if value in ("", "did not start"):
                    assert row["cell"] not in pools.cell, row
                else:
                    assert _int(value) == pools.cell[row["cell"]], row
                    checked += 1
            elif "KV dtype" in columns and "pool tokens" in columns:   # start-up per max_model_len
                length, kv = _int(row["max_model_len"]), row["KV dtype"]
                for column, key in ((f"{pools.baseline} pool tokens", (pools.baseline, length)),
                                    ("pool tokens", (kv, length))):
                    if row[column]:
                        assert _int(row[column]) == pools.by_kv[key], row
                        checked += 1
                if row[f"ratio vs {pools.baseline}"]:
                    assert row[f"ratio vs {pools.baseline}"] == pools.ratio(kv, length) + "×", row
            elif "KV configuration" in columns and "KV pool tokens" in columns:   # the remedy section's
                length, kv = _int(row["max_model_len"]), row["KV configuration"]
                for column, key in (("KV pool tokens", (kv, length)),
                                    (f"{pools.baseline} pool tokens", (pools.baseline, length))):
                    if key in pools.by_kv:
                        assert _int(row[column]) == pools.by_kv[key], row
                        checked += 1
                    elif row[column]:   # not measured: the table says its figures are then vLLM's estimate
                        assert f"(a cell that did not start shows {ESTIMATE})" in review, row
            elif "longest max_model_len on this budget" in columns:   # the recommendation: a length, predicted
                value = row["longest max_model_len on this budget"]
                assert "pool holds" not in value, row
                if re.match(r"[\d,]+", value):
                    assert "predicted" in value, row
    return checked


def _check_lines(review: str, pools: Pools) -> None:
    """The sentences that state a pool or a ratio: measured, or labelled as vLLM's estimate."""
    measured_ratios = {f"{pools.by_kv[(kv, n)] / pools.by_kv[(pools.baseline, n)]:.2g}"
                       for kv, n in pools.by_kv if (pools.baseline, n) in pools.by_kv}
    for line in review.split("\n"):
        at = re.match(r"- At max_model_len ([\d,]+) .*did not start", line)
        if at:   # a length where a cell did not start: the ratio rests on vLLM's estimate, each figure labelled
            length = _int(at[1])
            assert f"rests on {ESTIMATE}" in line, line
            figures = re.findall(r"(\S+) ([\d,]+) \((measured|vLLM's estimate)\)", line)
            assert len(figures) == 2, line
            for kv, tokens, label in figures:
                if label == "measured":
                    assert _int(tokens) == pools.by_kv[(kv, length)], line
                else:
                    assert (kv, length) not in pools.by_kv, line   # an estimate never stands for a measured pool
        ratio = re.match(r"- (\S+): measured ([\d.]+)×", line)
        if ratio:   # the capacity section's ratio per cell
            cell = ratio[1]
            kv = next(kv for (kv, n), tokens in pools.by_kv.items()
                      if n == pools.lengths[cell] and tokens == pools.cell[cell])
            assert ratio[2] == pools.ratio(kv, pools.lengths[cell]), line
        for held, rest in re.findall(r"holds (?:at least )?([\d.]+)× the `\w+` pool( \(from vLLM's estimate\))?", line):
            assert rest or held in measured_ratios, line   # the headline
        assert "its pool is known" not in line, line


@pytest.mark.parametrize("run_dir", RUN_DIRS, ids=IDS)
def test_every_pool_figure_of_a_published_review_is_the_measured_one_or_labelled(run_dir):
    review, evidence, _ = _published(run_dir)
    pools = Pools(evidence)
    checked = _check_tables(review, pools)
    _check_lines(review, pools)
    assert checked >= len(pools.cell)   # each measured pool was met at least once (the start-up table)


def test_the_cpu_demo_states_vllms_estimate_as_such_beside_the_measured_pool():
    review, evidence, _ = _published(REPORTS / "cpu-demo")
    assert Pools(evidence).cell == {"auto-1024": 1792}
    lines = [line for line in review.split("\n") if "1,664" in line or "2.15×" in line]
    assert lines and all(ESTIMATE in line or line.startswith("| auto-2048 ") for line in lines), lines
    (row,) = [line for line in lines if line.startswith("| auto-2048 ")]
    assert row.split("|")[4].strip() == ""   # no pool in the KV pool column: 1,664 is vLLM's estimated length
    assert f"auto 1,792 (measured) vs fp8 3,584 ({ESTIMATE}) tokens, 2.00×" in review


def _constructed() -> tuple[str, schema.Evidence]:
    """auto and fp8 start at 1024 on the demo's 40 MiB (1,792 and 3,584 tokens); at 2048 `auto` does not
    (kv_capacity, vLLM's estimate 1,664) while fp8 does (3,584): the demo's numbers, fp8 measured."""
    cells = complete_cells({
        "auto-1024": started_cell("auto", 1024, 1792, []),
        "fp8-1024": started_cell("fp8", 1024, 3584, []),
        "auto-2048": failed_cell("auto", 2048, reason="kv_capacity", message="ValueError: ... the estimated maximum "
                                 "model length is 1664."),
        "fp8-2048": started_cell("fp8", 2048, 3584, []),
    })
    cells["auto-2048"]["failure"]["estimated_max_model_len"] = 1664
    for facts in cells.values():
        if facts["started"]:   # 128-token blocks, as on the CPU: the capacity section predicts each pool
            facts["capacity"].update(block_size=128, num_blocks=facts["capacity"]["kv_pool_tokens"] // 128)
    cells["auto-2048"]["logged_capacity"]["kv_pool_tokens"] = None
    manifest = planned_manifest([{"id": name, "kv_spec": c["kv_spec"], "max_model_len": c["max_model_len"]}
                                 for name, c in cells.items()])
    manifest["model"]["kv_layout"] = copy.deepcopy(TEMPLATE_MANIFEST["model"]["kv_layout"])
    manifest = typed_manifest(manifest)
    evidence = build_evidence(manifest, [], typed_cells(cells))
    return render_review(manifest, evidence, evaluate(evidence)), evidence


def test_a_constructed_run_states_each_pool_once():
    review, evidence = _constructed()
    pools = Pools(evidence)
    assert pools.cell == {"auto-1024": 1792, "fp8-1024": 3584, "fp8-2048": 3584}
    assert _check_tables(review, pools) >= 3
    _check_lines(review, pools)
    assert "- fp8-1024: measured 2.00×" in review
    assert (f"- At max_model_len 2,048 a cell did not start, so this ratio rests on {ESTIMATE} (vLLM's estimated "
            f"maximum model length): auto 1,664 ({ESTIMATE}) vs fp8 3,584 (measured) tokens, 2.15×.") in review
    for line in review.split("\n"):
        if "2.15" in line:
            assert ESTIMATE in line, line


# --- the recovery bound and the margin --------------------------------------------------------------

@pytest.mark.parametrize("run_dir", RUN_DIRS, ids=IDS)
def test_no_published_review_states_a_negative_recovery_bound_or_contradicts_one(run_dir):
    review, _, _ = _published(run_dir)
    _check_bounds(review)


def _check_bounds(review: str) -> None:
    """No negative bound; the decision table's bound is the one the verdict states; a recovery said to sit
    at or under the margin is not also given the sample count that would show it non-inferior."""
    assert not re.search(r"(lower bound|recovery ≥)\s*[−-]\s*\d", review)
    assert "within 2 points" not in review
    lines = review.split("\n")
    for row in lines:   # the decision table's bound is the one any sentence on the cell states
        found = re.match(r"\| (\S+) .*recovery ≥ ([\d.]+ %)", row)
        if found:
            stated = {bound for line in lines if line.startswith(f"- {found[1]}:")
                      for bound in re.findall(r"lower bound ([\d.]+ %)", line)}
            assert stated <= {found[2]}, (found[1], found[2], stated)
    for line in lines:
        if "is not 2 points above the margin" in line:
            cell = re.match(r"- (?:\(\w+\) )?(\S+): ", line)[1]   # cell ids may hold ':' (fp8:keep=3-2048)
            assert not any(other.startswith(f"- {cell}:") and "paired samples per cell (now" in other
                           for other in lines), cell


def _review_of_tasks(entry: dict) -> tuple[str, object]:
    """The review of test_gate's fp8-8192 vs auto-8192 evidence (healthy divergence) with these task figures."""
    evidence = gate_evidence(tasks={"reference": "auto-8192", **entry})
    manifest = typed_manifest(planned_manifest([{"id": "auto-8192", "kv_spec": "auto", "max_model_len": 8192},
                                                {"id": "fp8-8192", "kv_spec": "fp8", "max_model_len": 8192}]))
    verdict = evaluate(evidence)
    return render_review(manifest, evidence, verdict), verdict


def test_a_bound_that_would_go_below_zero_reads_zero_in_the_review():
    # An early look spends a tiny alpha: the score bound's formula would go below 0 (the old review: "−78 %").
    review, verdict = _review_of_tasks({"n": 12, "b": 3, "c": 0, "baseline_accuracy": 0.5, "cell_accuracy": 0.25,
                                        "recovery": 0.5, "mcnemar_p": 0.25, "looks": [12], "n_max": 600,
                                        "final": False})
    (check,) = [c for c in verdict.checks if c.name == "task_noninferiority"]
    assert check.value >= 0 and "lower bound" in review
    _check_bounds(review)


def test_a_recovery_under_the_margin_is_the_finding_and_no_sentence_asks_for_samples_to_show_it():
    # 7 points under the 90 % margin: more samples would not show non-inferiority; the old hint said
    # "within 2 points" and named a sample count.
    review, _ = _review_of_tasks({"n": 54, "b": 6, "c": 2, "baseline_accuracy": 0.5, "cell_accuracy": 0.43,
                                  "recovery": 0.85, "mcnemar_p": 0.29})
    assert "is not 2 points above the margin 90.0 %" in review and "that is the finding" in review
    assert "(now 54)" not in review
    _check_bounds(review)


def test_a_recovery_above_the_margin_names_the_samples_that_would_decide_it():
    review, _ = _review_of_tasks({"n": 54, "b": 2, "c": 2, "baseline_accuracy": 0.5, "cell_accuracy": 0.5,
                                  "recovery": 1.0, "mcnemar_p": 1.0})
    assert "paired samples per cell (now 54)" in review and "above the margin" not in review


# --- the README's promises --------------------------------------------------------------------------

def _reading_the_review() -> str:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    start = readme.index("## Reading the review\n")
    return readme[start:readme.index("\n## ", start + 1)]


@pytest.mark.parametrize("run_dir", RUN_DIRS, ids=IDS)
def test_the_readme_promises_only_sections_the_published_review_has(run_dir):
    promised = _reading_the_review()
    review, _, manifest = _published(run_dir)
    assert "**Start-up and KV pool**" in promised and "\n## Start-up and KV pool\n" in review
    assert "**Why**" in promised and ("\nWhy:\n" in review or "\nEvery required check passed:\n" in review)
    assert "**Recommendation**" in promised and "**KV capacity**" in promised
    if manifest.model.kv_layout is not None:
        assert "\n## Recommendation\n" in review and "\n## KV capacity: predicted vs measured\n" in review
    else:   # a run before kveval recorded the layout: the README says such reports have neither
        assert "\n## Recommendation\n" not in review and "\n## KV capacity" not in review
        assert "the oldest published reports\n  predate that and have neither" in promised


def test_the_published_reports_without_a_kv_layout_are_the_oldest_only():
    without = {str(p.relative_to(REPORTS)) for p in RUN_DIRS if RunDir(p).manifest().model.kv_layout is None}
    assert without == {"h200-smollm2", "h200-planted-layers", "h200-qwen2.5-coder-1.5b",
                       "h200-qwen2.5-coder-1.5b/keep-layers"}


# --- reports/README.md on the Qwen remedy -----------------------------------------------------------

def test_reports_readme_says_what_the_qwen_review_says_of_its_remedy():
    readme = (REPORTS / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## `h200-qwen2.5-coder-1.5b/`"):]
    section = " ".join(section[:section.index("\n## ")].split())
    review, evidence, _ = _published(REPORTS / "h200-qwen2.5-coder-1.5b")
    remedy = review[review.index("\n## Remedy\n"):review.index("\n## ", review.index("\n## Remedy\n") + 1)]
    # That run's planner proposed nothing ("not range clipping"): the README quotes the review's note.
    quoted = re.search(r'the remedy of that commit proposed nothing \("([^"]+)"\)', section)
    assert quoted and quoted[1] in remedy and "No remedy for fp8" in remedy
    # Today's planner tries the two outlier layers: so says the README, the review, and the planner itself.
    assert "Today's planner would try the two outlier layers" in section
    outliers = evidence.diagnosis["fp8"].outlier_layers
    assert outliers == [0, 1]
    assert "Outlier layers 0, 1" in review
    assert "now keeps when no layer clips: `--kv fp8:keep=0,1`" in remedy
    remedy_now = plan_remedy(evaluate(evidence), evidence)
    assert {spec.text for spec, _ in remedy_now.cells} == {"fp8:keep=0,1"}
    assert any(note.startswith("Remedy for fp8: keep layers 0, 1") for note in remedy_now.notes)
    # and what was run explicitly is that configuration
    assert "`keep-layers/`: `kveval compare --model … --kv fp8:keep=0 fp8:keep=0,1 auto" in section
