"""The parent -> cell message (files/cell_spec.py): every phase setting comes from the parent (no
phase default of its own), the message survives its JSON file unchanged, and a key it does not know
is refused rather than silently ignored."""
from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from kveval.files.cell_spec import CellSpec, PhaseOptions, TasksOptions
from kveval.inputs.suites import SUITES
from kveval.run.settings import build_phase_options
from kveval.run.options import CompareOptions


def _spec(phase_options: PhaseOptions | None) -> CellSpec:
    return CellSpec(cell_id="fp8:keep=0-1024", run_dir="/r", engine={"model": "/m", "kv_cache_dtype": "fp8"},
                    kv_spec="fp8:keep=0", phases=["scoring", "speed"], phase_options=phase_options,
                    workloads_path="/r/workloads.json", result_path="/r/cells/c.json",
                    events_path="/r/cells/c.events", log_path="/r/cells/c.log")


def test_the_suite_and_the_users_options_set_every_phase_setting():
    suite = SUITES["quick"]
    options = build_phase_options(CompareOptions(speed_runs=5, task_limit=7, concurrency=(1, 2)), suite, [], ["passkey"])
    assert options.scoring.top_k == suite.scoring_top_k and options.scoring.noise is True
    assert options.speed.runs == 5 and options.speed.warmup == suite.speed_warmup
    assert options.speed.max_tokens == suite.speed_max_tokens
    assert options.tasks == TasksOptions(tasks=["passkey"], limit=7)
    assert options.throughput.levels == [1, 2] and options.throughput.prompt_share == suite.throughput_prompt_share
    assert options.throughput.max_tokens == suite.throughput_max_tokens


def test_a_phase_setting_has_no_default_of_its_own():
    with pytest.raises(ValidationError, match="runs"):
        PhaseOptions.model_validate({"scoring": {"top_k": 20, "noise": True},
                                     "speed": {"warmup": 1, "workloads": None, "max_tokens": None},
                                     "tasks": {"tasks": [], "limit": None},
                                     "throughput": {"levels": [1], "prompt_share": 0.5, "max_tokens": 64}})


def test_the_message_survives_its_file_and_refuses_unknown_keys():
    options = build_phase_options(CompareOptions(), SUITES["standard"], [], [])
    spec = _spec(options)
    assert CellSpec.model_validate(json.loads(json.dumps(spec.model_dump(mode="json")))) == spec
    assert CellSpec.model_validate(json.loads(json.dumps(_spec(None).model_dump(mode="json")))).phase_options is None
    with pytest.raises(ValidationError, match="gpu_ids"):
        CellSpec.model_validate({**spec.model_dump(mode="json"), "gpu_ids": [0]})
