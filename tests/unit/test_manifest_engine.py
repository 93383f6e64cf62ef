"""The manifest records each cell's engine settings (issue 19): `cells[].engine` is what the cell is
started with (run/plan.planned_cell), typed by schema.PlannedEngine; manifests of older runs, without it,
still load. The review's Run section names only the cells started otherwise than its engine options say
(a quality reference's own KV budget), one group per distinct setting set."""
from __future__ import annotations

import copy
import dataclasses
import json

import pytest

from kveval.files import schema
from kveval.render.run_section import run_section
from kveval.run.options import CompareOptions
from kveval.run.plan import plan_cells, planned_cell
from kveval.run.reference import reference_id
from tests.support.constructed import TEMPLATE_MANIFEST
from tests.support.evidence import typed_evidence

# The CPU demo's engine options: a 40 MiB KV budget, enforce_eager, seed 0.
OPTIONS = CompareOptions(kv=("fp8:keep=0,1", "fp8", "auto"), max_model_len=(1024,), kv_cache_memory="40MiB",
                         enforce_eager=True, engine_args={"max_num_seqs": 8})


def _manifest(cells: list[dict], **options) -> schema.Manifest:
    document = copy.deepcopy(TEMPLATE_MANIFEST)
    document["options"]["engine_args"] = {"max_num_seqs": 8}
    document["options"].update(options)
    document["cells"] = json.loads(json.dumps(cells))   # as stored: through JSON
    return schema.parse(schema.Manifest, document, "manifest.json")


def test_each_planned_cell_carries_the_engine_settings_it_is_started_with():
    plans = plan_cells(OPTIONS, "/models/smollm2", None)
    cells = [planned_cell(plan) for plan in plans]
    assert [c["id"] for c in cells] == ["auto-1024", "fp8:keep=0,1-1024", "fp8-1024"]
    keep = cells[1]
    assert {key: keep[key] for key in ("id", "kv_spec", "max_model_len")} == {
        "id": "fp8:keep=0,1-1024", "kv_spec": "fp8:keep=0,1", "max_model_len": 1024}
    assert keep["engine"] == {"kv_cache_dtype": "fp8", "kv_cache_dtype_skip_layers": ["0", "1"], "max_model_len": 1024,
                              "seed": 0, "kv_cache_memory_bytes": 40 * 2 ** 20, "gpu_memory_utilization": None,
                              "enforce_eager": True, "extra": {"max_num_seqs": 8}}
    assert "model" not in keep["engine"]   # the manifest's model.path says it once
    manifest = _manifest(cells)
    assert manifest.cells[1].engine.kv_cache_dtype_skip_layers == ["0", "1"]
    assert schema.dump(manifest)["cells"] == json.loads(json.dumps(cells))   # round-trips as written


def test_auto_runs_as_the_model_dtype_where_vllm_would_make_it_fp8():
    (auto, *_) = plan_cells(OPTIONS, "/m", None, baseline_dtype="bfloat16")
    assert planned_cell(auto)["kv_spec"] == "auto" and planned_cell(auto)["engine"]["kv_cache_dtype"] == "bfloat16"


def test_a_manifest_of_an_older_run_without_engine_settings_still_loads():
    manifest = _manifest([{"id": "auto-1024", "kv_spec": "auto", "max_model_len": 1024}])
    assert manifest.cells[0].engine is None
    assert "other engine settings" not in run_section(manifest, typed_evidence({}))


def test_an_undeclared_engine_key_is_refused():
    cell = planned_cell(plan_cells(OPTIONS, "/m", None)[0])
    cell["engine"]["swap_space"] = 4   # a user's vLLM argument belongs in `extra`
    with pytest.raises(schema.FileError, match="swap_space"):
        _manifest([cell])


def test_the_run_section_names_only_the_cells_started_otherwise():
    plans = plan_cells(OPTIONS, "/m", None)
    # A quality reference keeps the failed baseline's settings but its own, larger KV budget (run/reference.py).
    reference = dataclasses.replace(plans[0], id=reference_id(plans[0].id),
                                    engine={**plans[0].engine, "kv_cache_memory_bytes": 100 * 2 ** 20})
    manifest = _manifest([planned_cell(plan) for plan in [*plans, reference]])
    text = run_section(manifest, typed_evidence({}))
    lines = [line for line in text.split("\n") if "other engine settings" in line]
    assert lines == ["- **Cells started with other engine settings** (manifest `cells[].engine`): "
                     "auto-1024.reference: KV budget 104,857,600 bytes"]
    # every cell as the options say: no line
    same = _manifest([planned_cell(plan) for plan in plans])
    assert "other engine settings" not in run_section(same, typed_evidence({}))
