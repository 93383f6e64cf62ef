"""RunState (run/state.py): the typed manifest behind the one writer. Each change is one atomic write of
what the manifest dict used to be written as, byte for byte; a change the schema refuses writes nothing."""
from __future__ import annotations

import json

import pytest

from kveval.files import schema
from kveval.files.rundir import RunDir, write_json_atomic
from kveval.run.state import RunState
from tests.support.constructed import planned_manifest


def _state(tmp_path) -> tuple[RunState, dict]:
    data = planned_manifest([{"id": "auto-1024", "kv_spec": "auto", "max_model_len": 1024}])
    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    return RunState.write_new(run, data), json.loads(json.dumps(data))


def test_a_change_is_written_as_the_dict_was_and_held_typed(tmp_path):
    state, data = _state(tmp_path)
    assert state.run.manifest_path.read_text() == json.dumps(data, indent=1, ensure_ascii=False) + "\n"
    remedy = {"mode": "auto", "notes": ["Remedy for fp8: ..."], "cells": ["fp8:keep=0-1024"]}
    state.change(remedy=remedy, cells=[*data["cells"], {"id": "fp8:keep=0-1024", "kv_spec": "fp8:keep=0",
                                                         "max_model_len": 1024}])
    data["remedy"] = remedy                      # a new key goes last, as the dict's did
    data["cells"].append({"id": "fp8:keep=0-1024", "kv_spec": "fp8:keep=0", "max_model_len": 1024})
    expected = tmp_path / "expected.json"
    write_json_atomic(expected, data)
    assert state.run.manifest_path.read_bytes() == expected.read_bytes()
    assert isinstance(state.manifest.remedy, schema.Remedy) and state.manifest.remedy.cells == ["fp8:keep=0-1024"]
    assert [c.id for c in state.manifest.cells] == ["auto-1024", "fp8:keep=0-1024"]
    assert schema.dump(state.run.manifest()) == data


def test_with_planned_adds_only_cells_not_yet_planned(tmp_path):
    from types import SimpleNamespace

    state, _ = _state(tmp_path)
    cells = state.with_planned([SimpleNamespace(id="auto-1024")])
    assert cells == [{"id": "auto-1024", "kv_spec": "auto", "max_model_len": 1024}]


def test_a_refused_change_writes_nothing(tmp_path):
    state, _ = _state(tmp_path)
    before = state.run.manifest_path.read_bytes()
    with pytest.raises(schema.FileError):
        state.change(remedy={"mode": "sometimes", "notes": [], "cells": []})
    assert state.run.manifest_path.read_bytes() == before and state.manifest.remedy is None
