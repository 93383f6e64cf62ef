"""Divergence evidence until decided, end to end on the fake engine (KVEVAL_ENGINE=fake, no vLLM, so every
CPU kind runs it): an FP8 drift planted in the gap of this CPU's budget (between the healthy budget and the
harm limit: 0.05-0.075 without AMX, 0.08-0.12 with it), so no look can settle it; rounds score new documents in the cell
and its baseline, looks double (10 -> 20 -> 40 sequences), the last is final, and the review says what
was done and what else decides."""
from __future__ import annotations

import json
import math

import pytest

import kveval
from kveval.evidence import cpu_profile
from kveval.files.rundir import RunDir, read_json
from kveval.gate.thresholds import PROFILES
from kveval.run.environment import cpu_flags
from tests.support.quiet import Quiet

# Two short prompts, no probes beyond the pool's first look: divergence is the subject.
SCORING_ONLY = {"short_256": 2, "short_512": 0, "probe": 100, "ctx_1k": 0, "ctx_pct": 0, "over": 1}
BUDGET = PROFILES[cpu_profile(cpu_flags())][0]   # the profile this host's cells are judged by
# The fake's logit noise 0.55 gives a KL of about 0.097, the geometric middle of the gap 0.08-0.12; KL grows
# about as the noise squared, so the noise is scaled to the middle of this host's gap.
NOISE = 0.55 * math.sqrt(math.sqrt(BUDGET.kl_mean_max * BUDGET.kl_mean_fail) / 0.098)


@pytest.fixture(scope="module")
def in_the_gap(tmp_path_factory, default_model_dir):
    patch = pytest.MonkeyPatch()
    patch.setenv("KVEVAL_ENGINE", "fake")
    patch.setenv("KVEVAL_FAKE_DAMAGE", json.dumps({"fp8_noise": NOISE}))
    patch.setenv("KVEVAL_NO_PLOTS", "1")
    try:
        return kveval.compare(model=str(default_model_dir), kv=["fp8", "auto"], max_model_len=[1024],
                              kv_cache_memory="60MiB", suite="quick", tasks=["none"],
                              out=tmp_path_factory.mktemp("scoring") / "gap", progress=Quiet(), counts=SCORING_ONLY,
                              phases=("generation", "scoring"), diagnose=False)
    finally:
        patch.undo()


def test_rounds_score_new_documents_until_the_design_is_spent(in_the_gap):
    record = RunDir(in_the_gap.run_dir).load_manifest()["task_rounds"]
    assert [r["scoring_cells"] for r in record["rounds"]] == [["auto-1024", "fp8-1024"]] * 2
    assert [r["document_target"] for r in record["rounds"]] == [20, 40]
    assert record["documents_n_max"] == 48 and record["final_divergence"] == ["fp8-1024"]
    assert "48 scored sequences per cell are spent" in record["stopped"]
    (comp,) = [c for c in in_the_gap.evidence.divergence.comparisons if c.kind == "kv"]
    assert comp.looks == [10, 20, 40] and comp.design.final is True
    assert comp.clustered["kl_mean"].clusters == 40


def test_round_documents_are_new_text_scored_alike_in_the_cell_and_its_baseline(in_the_gap):
    run_dir = in_the_gap.run_dir
    first = read_json(run_dir / "rounds" / "documents-r1-L1024.json")
    second = read_json(run_dir / "rounds" / "documents-r2-L1024.json")
    ids = [d["id"] for d in first + second]
    assert len(ids) == len(set(ids)) == 10 + 20 and all(i.startswith("doc:r") for i in ids)
    texts = {tuple(d["token_ids"]) for d in first + second}
    assert len(texts) == len(ids)                       # no document is scored twice
    for name in ("auto-1024", "fp8-1024"):
        scoring = read_json(run_dir / "cells" / f"{name}.json")["phases"]["scoring"]
        original = {s["id"] for s in scoring["sequences"]}
        assert not original & set(ids)                  # round documents are not the first look's


def test_a_drift_shown_between_the_budgets_stays_open_and_says_what_else_decides(in_the_gap):
    assert in_the_gap.verdict.cells["fp8-1024"] == "INCONCLUSIVE"
    (reason,) = [r for r in in_the_gap.verdict.reasons if r.cell == "fp8-1024" and r.code == "divergence_undecided"]
    assert (f"is shown between the healthy budget {BUDGET.kl_mean_max:g} and the harm limit {BUDGET.kl_mean_fail:g}"
            in reason.message)
    assert "the final look" in reason.message
    assert "task accuracy" in reason.decide and "more scored documents" not in reason.decide
    review = (in_the_gap.run_dir / "review.md").read_text()
    assert ("round 1 at 1024: new documents scored for fp8-1024 (aiming at 20 scored sequences); round 2 at 1024: "
            "new documents scored for fp8-1024 (aiming at 40 scored sequences)") in review
