"""kveval.files.schema: real run files validate and round-trip exactly; damaged and old ones fail clearly."""
from __future__ import annotations

import copy
import gzip
import json
from pathlib import Path

import pytest
from typing import get_args, get_origin

from kveval.files import schema as files
from tests.support.golden import old_cpu_demo

REPORTS = Path(__file__).resolve().parents[2] / "reports"
OLD_REPORTS = REPORTS / "archive"
QWEN = REPORTS / "h200-qwen2.5-coder-1.5b"
OLD_CPU = old_cpu_demo()   # complete run directory with real cell files (tests/golden)
CPU = REPORTS / "cpu-demo"
STARTED_CELL = OLD_CPU / "cells/auto-1024.json"
KIND_OF = {"manifest.json": "manifest", "results.json": "results", "results.json.gz": "results",
           "kv_ranges.json": "kv_ranges"}


def _real_files() -> list[tuple[str, Path]]:
    found = []
    for run in [*sorted(p.parent for p in REPORTS.rglob("manifest.json") if "archive" not in p.parts), OLD_CPU]:
        for name, kind in KIND_OF.items():
            if run == OLD_CPU and kind == "results":
                continue  # results schema 1: refused by version (test_old_results_version_is_named)
            if (run / name).is_file():
                found.append((kind, run / name))
        found += [("cell", path) for path in sorted((run / "cells").glob("*.json"))
                  if not path.name.endswith(".spec.json")]
    return found


REAL = _real_files()


def _text(path: Path) -> str:
    data = path.read_bytes()
    return (gzip.decompress(data) if path.suffix == ".gz" else data).decode("utf-8")


def _read(path: Path):
    return json.loads(_text(path))


def _as_written(kind: str, data) -> str:
    """The text kveval's writers make of `data`: cells compact, manifest and results indented
    (files.rundir.write_json_atomic)."""
    if kind == "cell":
        return json.dumps(data, ensure_ascii=False, separators=(",", ":")) + "\n"
    return json.dumps(data, ensure_ascii=False, indent=1) + "\n"


def _same(a, b) -> bool:
    """== on the dicts, with NaN (which is never == itself) compared as text."""
    return a == b or json.loads(json.dumps(a), parse_constant=str) == json.loads(json.dumps(b), parse_constant=str)


def _error(kind, path) -> str:
    with pytest.raises(files.FileError) as caught:
        files.load(kind, path)
    message = str(caught.value)
    assert str(path) in message and "Traceback" not in message
    return message


def _damaged(tmp_path: Path, source: Path, change, name: str | None = None) -> Path:
    data = _read(source)
    change(data)
    path = tmp_path / (name or source.name.removesuffix(".gz"))
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


# --- real files ------------------------------------------------------------------------------------

def test_every_kind_has_real_examples():
    kinds = {kind for kind, _ in REAL}
    assert kinds == {"manifest", "cell", "results", "kv_ranges"}
    assert len([p for k, p in REAL if k == "cell"]) == 4


@pytest.mark.parametrize("kind,path", REAL, ids=[str(p.relative_to(REPORTS)) if REPORTS in p.parents else f"old/{p.relative_to(OLD_CPU)}" for _, p in REAL])
def test_real_file_validates_and_round_trips_exactly(kind, path):
    model = files.load(kind, path)
    assert isinstance(model, files.KINDS[kind])
    text = _text(path)
    # A file of the version before the current one reads as files.upgrade brings it up (issue 17: the
    # published reports and the old demo's cells): that is what it round-trips to.
    original = json.loads(text)
    version = original.get("schema_version")
    current, dumped = files.upgrade(kind, original), files.dump(model)
    upgraded = current.get("schema_version") != version
    assert _same(dumped, current)
    # Written back the way kveval writes it, the bytes equal the file's: same key order (json.dumps
    # with sort_keys=False), ints still ints, floats floats, None None, NaN NaN. This is json.dumps
    # of both compared, and more (json.dumps of the 30 MB cells twice more would only cost time).
    assert _as_written(kind, dumped) == (_as_written(kind, current) if upgraded else text)


@pytest.mark.parametrize("kind,path", [(k, p) for k, p in REAL if k != "cell" or "cpu-demo" in str(p)])
def test_pydantic_model_dump_round_trips_too(kind, path):
    model = files.load(kind, path)
    assert json.dumps(model.model_dump(exclude_unset=True)) == json.dumps(files.upgrade(kind, _read(path)))


def test_typed_fields_are_typed():
    manifest = files.load("manifest", QWEN / "manifest.json")
    assert manifest.options.max_model_len == [8192, 32768] and manifest.cells[0].id == "auto-8192"
    results = files.load("results", QWEN / "results.json.gz")
    assert results.verdict.status == "FAIL" and results.verdict.cells == {"fp8-8192": "FAIL", "fp8-32768": "FAIL"}
    assert isinstance(results.evidence.tasks, files.TaskEvidence)
    assert results.evidence.platform.profile == "gpu"
    cell = files.load("cell", STARTED_CELL)
    assert cell.started and cell.capacity.kv_pool_tokens > 0 and cell.phases.tasks.samples


def test_cells_that_did_not_start_from_the_child():
    # Written by the child when the engine failed to start (then `process` added by the parent).
    cell = files.load("cell", OLD_CPU / "cells/fp8-1024.json")
    assert not cell.started and cell.failure.reason == "unsupported_dtype"
    assert cell.engine_settings is not None and cell.startup_seconds is not None
    assert cell.info.vllm_version == "0.32.0" and cell.process.timed_out is None


RUNNER_NOT_STARTED = {  # as the parent wrote it before issue 9, when the child died before writing anything
    "cell": "fp8-2048", "kv_cache_dtype": "fp8", "max_model_len": 2048, "started": False,
    "failure": {"reason": "oom", "message": "kveval stopped the cell after its timeout of 60 s. CUDA out of memory",
                "estimated_max_model_len": None, "backend": None},
    "logged_capacity": {"kv_pool_tokens": None, "max_concurrency": None},
    "phases": {}, "info": {"attention_backend": None}, "complete": True,
    "process": {"exit_code": -9, "seconds": 61.2, "timed_out": True},
}


def test_cells_that_did_not_start_from_the_parent():
    cell = files.parse("cell", copy.deepcopy(RUNNER_NOT_STARTED), "cells/fp8-2048.json")
    assert cell.engine_settings is None and cell.startup_seconds is None and cell.process.timed_out
    # A cell file of version 1 (no schema_version) reads as version 2: the version first, the KV spec's
    # key renamed in its place.
    current = {"schema_version": files.CELL_VERSION,
               **{"kv_spec" if key == "kv_cache_dtype" else key: value for key, value in RUNNER_NOT_STARTED.items()}}
    assert json.dumps(files.dump(cell)) == json.dumps(current)


def test_started_cell_that_crashed_in_a_phase():
    data = _read(STARTED_CELL)
    data["phases"]["speed"] = {"error": "RuntimeError: engine died", "seconds": 1.5}
    data["crash"] = {"message": "cell process exited with code -11 before finishing", "last_log_line": "Segfault"}
    cell = files.parse("cell", data)
    assert cell.phases.speed.error and cell.crash.last_log_line == "Segfault"
    assert json.dumps(files.dump(cell)) == json.dumps(data)


def test_run_without_tasks_and_failed_diagnosis():
    data = _read(REPORTS / "h200-smollm2/results.json.gz")
    data["evidence"]["tasks"] = {}
    data["evidence"]["diagnosis"] = {"fp8": {"error": "the K/V range pass failed: out of memory"}}
    results = files.parse("results", data)
    assert results.evidence.tasks == {} and results.evidence.diagnosis["fp8"].error.startswith("the K/V")
    assert json.dumps(files.dump(results)) == json.dumps(data)
    failed = files.parse("kv_ranges", {"error": "the K/V range pass failed: timed out after 1800 s"})
    assert failed.layers is None and files.dump(failed) == {"error": "the K/V range pass failed: timed out after 1800 s"}


def test_whole_numbers_in_number_fields_stay_ints():
    # kveval.compare(gpu_memory_utilization=1, cell_timeout=600) stores ints; 1.0 would change the file.
    data = _read(QWEN / "manifest.json")
    data["options"].update(gpu_memory_utilization=1, cell_timeout_s=600, lengths=[0.5, 1])
    dumped = files.dump(files.parse("manifest", data))
    assert json.dumps(dumped) == json.dumps(data) and '"cell_timeout_s": 600,' in json.dumps(dumped)


def test_newer_optional_keys_are_kept_in_place():
    data = _read(CPU / "manifest.json")
    data = {"schema_version": 1, **data}
    data["model"]["revision"] = "abc"
    assert json.dumps(files.dump(files.parse("manifest", data))) == json.dumps(data)


@pytest.mark.parametrize("where,change", [
    ("new_top_key", lambda d: d.update(new_top_key={"x": 1})),
    ("model.new_fact", lambda d: d["model"].update(new_fact=1)),
    ("options.new_option", lambda d: d["options"].update(new_option=True)),
    ("cells[0].new_field", lambda d: d["cells"][0].update(new_field="x")),
])
def test_unknown_field_in_a_manifest_is_refused_naming_it(tmp_path, where, change):
    # Like a cell file: a manifest key this kveval does not declare (a newer kveval's) is refused, not kept.
    path = _damaged(tmp_path, CPU / "manifest.json", change)
    assert _error("manifest", path) == (f"{path}: field {where}: not a field this kveval knows (a file from a newer "
                                        "kveval? its schema_version says which kveval reads it)")


@pytest.mark.parametrize("where,change", [
    ("new_top_key", lambda d: d.update(new_top_key=1)),
    ("verdict.thresholds.new_limit", lambda d: d["verdict"]["thresholds"].update(new_limit=0.1)),
    ("evidence.startup[0].new_figure", lambda d: d["evidence"]["startup"][0].update(new_figure=2)),
])
def test_unknown_field_in_results_is_refused_naming_it(tmp_path, where, change):
    # results.json too (issue 17): a key a newer kveval added is refused, never half-read.
    path = _damaged(tmp_path, QWEN / "results.json.gz", change)
    assert _error("results", path) == (f"{path}: field {where}: not a field this kveval knows (a file from a newer "
                                       "kveval? its schema_version says which kveval reads it)")


def test_unknown_field_in_kv_ranges_is_refused_naming_it(tmp_path):
    path = _damaged(tmp_path, CPU / "kv_ranges.json", lambda d: d["layers"][0]["k"].update(new_stat=1.0))
    assert _error("kv_ranges", path) == (f"{path}: field layers[0].k.new_stat: not a field this kveval knows (a file "
                                         "from a newer kveval? its schema_version says which kveval reads it)")


# --- damaged files ---------------------------------------------------------------------------------

def test_missing_required_key(tmp_path):
    path = _damaged(tmp_path, STARTED_CELL, lambda d: d.pop("max_model_len"))
    assert f"{path}: field max_model_len: missing (required)" in _error("cell", path)


def test_missing_started(tmp_path):
    path = _damaged(tmp_path, OLD_CPU / "cells/fp8-2048.json", lambda d: d.pop("started"))
    assert "field started: missing" in _error("cell", path)


def test_missing_key_of_one_shape(tmp_path):
    path = _damaged(tmp_path, STARTED_CELL, lambda d: d.pop("capacity"))
    assert "field capacity: missing (a started cell" in _error("cell", path)
    path = _damaged(tmp_path, STARTED_CELL, lambda d: d["phases"]["speed"].pop("workloads"))
    assert "field phases.speed.workloads: missing" in _error("cell", path)


def test_wrong_type(tmp_path):
    def change(d):
        d["capacity"]["kv_pool_tokens"] = "abc"
    path = _damaged(tmp_path, STARTED_CELL, change)
    assert f"{path}: field capacity.kv_pool_tokens: expected an integer, got 'abc'" in _error("cell", path)


def test_number_as_text_is_damage_not_a_number(tmp_path):
    def change(d):
        d["options"]["max_model_len"][1] = "32768"
        d["hardware"]["memory_gib"] = "125.8"
    message = _error("manifest", _damaged(tmp_path, QWEN / "manifest.json", change))
    assert "field options.max_model_len[1]: expected an integer, got '32768'" in message
    assert "field hardware.memory_gib: expected a number, got '125.8'" in message


def test_wrong_status_in_results(tmp_path):
    def change(d):
        d["verdict"]["cells"]["fp8-8192"] = "GOOD"
        d["verdict"]["checks"][2]["passed"] = "yes"
    message = _error("results", _damaged(tmp_path, QWEN / "results.json.gz", change))
    assert "field verdict.cells.fp8-8192: expected 'PASS', 'FAIL', 'INCONCLUSIVE', 'NOT STARTED' or 'MISSING'" in message
    assert "field verdict.checks[2].passed: expected true or false, got 'yes'" in message


def test_at_most_five_problems_are_listed(tmp_path):
    def change(d):
        for key in ("tool", "command", "created", "model", "options", "prompt_ids", "cells"):
            d.pop(key)
    message = _error("manifest", _damaged(tmp_path, QWEN / "manifest.json", change))
    assert len(message.splitlines()) == 6 and message.endswith("... and 2 more problems")


def test_bad_json(tmp_path):
    path = tmp_path / "results.json"
    path.write_text('{"schema_version": 1,', encoding="utf-8")
    message = _error("results", path)
    assert message.startswith(f"{path}: not valid JSON") and "\n" not in message


def test_top_level_not_an_object(tmp_path):
    path = tmp_path / "manifest.json"
    path.write_text("[1, 2]", encoding="utf-8")
    assert _error("manifest", path) == f"{path}: expected a JSON object at the top level, got a list"


@pytest.mark.parametrize("where,change", [
    ("new_top_key", lambda d: d.update(new_top_key=1)),
    ("phases.new_phase", lambda d: d["phases"].update(new_phase={"seconds": 1.0})),
    ("capacity.new_figure", lambda d: d["capacity"].update(new_figure=3)),
    ("phases.generation.records[0].new_field", lambda d: d["phases"]["generation"]["records"][0].update(new_field="x")),
    ("phases.scoring.sequences[0].positions[0].new_field",
     lambda d: next(s for s in d["phases"]["scoring"]["sequences"] if s.get("positions"))["positions"][0].update(new_field=1)),
    ("phases.speed.workloads[0].runs[0].new_timing", lambda d: d["phases"]["speed"]["workloads"][0]["runs"][0].update(new_timing=0.1)),
])
def test_unknown_field_in_a_cell_is_refused_naming_it(tmp_path, where, change):
    # A cell file with a key this kveval does not declare (a newer kveval's file) is refused, not half-read.
    path = _damaged(tmp_path, STARTED_CELL, change)
    message = _error("cell", path)
    assert message == (f"{path}: field {where}: not a field this kveval knows (a file from a newer kveval? "
                       "its schema_version says which kveval reads it)")


def test_open_parts_of_a_cell_keep_their_extra_keys():
    # engine_settings holds the user's --engine-arg values for vLLM; a task sample's extra fields reach its table.
    data = _read(STARTED_CELL)
    data["engine_settings"]["max_num_seqs"] = 64
    data["phases"]["tasks"]["samples"][0]["task_specific"] = [1, 2]
    cell = files.parse("cell", data)
    assert cell.engine_settings.model_extra == {"max_num_seqs": 64}
    assert json.dumps(files.dump(cell)) == json.dumps(data)


def test_phase_contents_are_typed():
    cell = files.load("cell", STARTED_CELL)
    record = cell.phases.generation.records[0]
    assert isinstance(record, files.GenerationRecord) and isinstance(record.token_ids, list)
    sequence = next(s for s in cell.phases.scoring.sequences if s.positions)
    assert isinstance(sequence.positions[0], files.ScoredPosition) and isinstance(sequence.positions[0].token, int)
    assert isinstance(cell.phases.tasks.samples[0], files.TaskSample)
    assert cell.phases.speed.workloads[0].ttft_s.n == len(cell.phases.speed.workloads[0].runs)


def test_missing_file(tmp_path):
    assert _error("cell", tmp_path / "cells/auto-2048.json") == f"{tmp_path / 'cells/auto-2048.json'}: no such file"


@pytest.mark.parametrize("kind,source", [("manifest", QWEN / "manifest.json"), ("results", QWEN / "results.json.gz"),
                                         ("cell", STARTED_CELL), ("kv_ranges", QWEN / "kv_ranges.json")])
def test_wrong_schema_version(tmp_path, kind, source):
    expected = files.VERSIONS[files.KINDS[kind]]
    path = _damaged(tmp_path, source, lambda d: d.update(schema_version=expected + 1))
    message = _error(kind, path)
    assert message.startswith(f"{path}: schema_version {expected + 1} — this kveval reads {expected} "
                              "(re-run with the kveval that wrote it")
    assert "\n" not in message


def test_missing_schema_version_only_allowed_for_cells(tmp_path):
    path = _damaged(tmp_path, QWEN / "manifest.json", lambda d: d.pop("schema_version"))
    assert "field schema_version: missing (required)" in _error("manifest", path)
    assert files.load("cell", STARTED_CELL).schema_version == files.CELL_VERSION


# --- files of the version before: brought up to date as they are read (issue 17) --------------------
#
# The user's KV spec text was `kv_cache_dtype`, the name of vLLM's engine dtype; it is `kv_spec` in cells
# of version 2, manifests of version 2 and results of version 3. files.upgrade renames it in a file of
# the version before (in place, at the key's position) and raises the version; vLLM's own keep the name.

PUBLISHED_RESULTS = sorted(p for p in REPORTS.rglob("results.json.gz") if "archive" not in p.parts)


def _keys_named(data, name: str, path: tuple = ()) -> list[tuple]:
    """The paths (keys and list indexes from the top) of the objects that hold the key `name`."""
    found = []
    if isinstance(data, dict):
        found += [path] if name in data else []
        for key, value in data.items():
            found += _keys_named(value, name, path + (key,))
    elif isinstance(data, list):
        for index, item in enumerate(data):
            found += _keys_named(item, name, path + (index,))
    return found


def _models_in(hint, steps: tuple = ()):
    """(model, steps) for each model a field's type holds: "*" for each list item or mapping value passed."""
    if isinstance(hint, type) and issubclass(hint, files.FileModel):
        yield hint, steps
        return
    origin, args = get_origin(hint), get_args(hint)
    if origin in (list, dict):
        yield from _models_in(args[-1], steps + ("*",))
        return
    for arg in args:   # Optional, unions, Annotated
        yield from _models_in(arg, steps)


def _paths_to_field(model, field: str, path: tuple = ()) -> set[tuple]:
    """Every path (keys, "*" for any item or value) from `model` to a record that declares `field`."""
    found = {path} if field in model.model_fields else set()
    for name, info in model.model_fields.items():
        for inner, steps in _models_in(info.annotation):
            found |= _paths_to_field(inner, field, path + (info.alias or name, *steps))
    return found


def test_the_upgrade_table_names_every_record_that_holds_the_kv_spec():
    upgrades = files._UPGRADES
    for model in (files.CellResult, files.Manifest, files.Results, files.Evidence):
        assert set(upgrades[model].at) == _paths_to_field(model, "kv_spec"), model.__name__
        assert upgrades[model].renamed == ("kv_cache_dtype", "kv_spec")
    # What still says kv_cache_dtype is vLLM's engine dtype: a cell's engine settings, a planned cell's
    # engine, the diagnosis of an FP8 dtype.
    assert _paths_to_field(files.CellResult, "kv_cache_dtype") == {("engine_settings",)}
    assert _paths_to_field(files.Manifest, "kv_cache_dtype") == {("cells", "*", "engine")}
    assert _paths_to_field(files.Results, "kv_cache_dtype") == {("evidence", "diagnosis", "*")}
    assert (upgrades[files.CellResult].source, upgrades[files.Manifest].source, upgrades[files.Results].source,
            upgrades[files.Evidence].source) == (1, 1, 2, 2)
    assert (files.CELL_VERSION, files.MANIFEST_VERSION, files.RESULTS_VERSION) == (2, 2, 3)


@pytest.mark.parametrize("name,kv", [("auto-1024", "auto"), ("fp8-1024", "fp8"), ("fp8-2048", "fp8")])
def test_a_version_1_cell_reads_with_its_kv_spec(name, kv):
    path = OLD_CPU / f"cells/{name}.json"
    raw = _read(path)
    assert "schema_version" not in raw and raw["kv_cache_dtype"] == kv   # as kveval wrote cells before issue 17
    cell = files.load("cell", path)
    assert (cell.schema_version, cell.kv_spec) == (files.CELL_VERSION, kv)
    dumped = files.dump(cell)
    assert list(dumped) == ["schema_version", *("kv_spec" if key == "kv_cache_dtype" else key for key in raw)]
    assert _keys_named(dumped, "kv_cache_dtype") == [("engine_settings",)]   # vLLM's, as it got it
    assert cell.engine_settings.kv_cache_dtype == kv


def test_a_version_1_manifest_reads_with_each_cells_kv_spec():
    path = REPORTS / "h200-smollm2-8192-defaults/manifest.json"
    raw = _read(path)
    assert raw["schema_version"] == 1 and [c["kv_cache_dtype"] for c in raw["cells"]] == ["auto", "fp8"]
    manifest = files.load("manifest", path)
    assert manifest.schema_version == files.MANIFEST_VERSION
    assert [(c.id, c.kv_spec) for c in manifest.cells] == [("auto-8192", "auto"), ("fp8-8192", "fp8")]
    dumped = files.dump(manifest)
    assert [list(c) for c in dumped["cells"]] == [["id", "kv_spec", "max_model_len"]] * 2
    assert not _keys_named(dumped, "kv_cache_dtype")


def test_a_version_1_manifest_keeps_the_engines_kv_cache_dtype():
    raw = _read(REPORTS / "h200-planted-layers/manifest.json")
    assert raw["schema_version"] == 1 and [c["kv_cache_dtype"] for c in raw["cells"]] == ["auto", "fp8", "fp8:keep=3,17"]
    for planned, (dtype, kept) in zip(raw["cells"], [("bfloat16", []), ("fp8", []), ("fp8", ["3", "17"])]):
        # Each planned cell's engine, as version 1 manifests from issue 19 on hold it (none published has one).
        planned["engine"] = {"kv_cache_dtype": dtype, "kv_cache_dtype_skip_layers": kept, "max_model_len": 8192,
                             "seed": 0, "kv_cache_memory_bytes": None, "gpu_memory_utilization": 0.9,
                             "enforce_eager": False, "extra": {}}
    manifest = files.parse("manifest", copy.deepcopy(raw))
    for planned, before in zip(manifest.cells, raw["cells"]):
        assert planned.kv_spec == before["kv_cache_dtype"]
        assert planned.engine.kv_cache_dtype == before["engine"]["kv_cache_dtype"]   # vLLM's (fp8 for fp8:keep=3,17)


def _results_version(path: Path) -> int:
    return _read(path)["schema_version"]


PUBLISHED_V2_RESULTS = [p for p in PUBLISHED_RESULTS if _results_version(p) == 2]   # written before issue 17's rename


@pytest.mark.parametrize("path", PUBLISHED_V2_RESULTS, ids=lambda p: str(p.parent.relative_to(REPORTS)))
def test_a_version_2_results_reads_with_kv_spec_everywhere(path):
    raw = _read(path)
    assert raw["schema_version"] == raw["evidence"]["schema_version"] == 2
    spec_keys = [where for where in _keys_named(raw, "kv_cache_dtype") if where[:2] != ("evidence", "diagnosis")]
    results = files.load("results", path)
    assert results.schema_version == results.evidence.schema_version == files.RESULTS_VERSION
    dumped = files.dump(results)
    assert _keys_named(dumped, "kv_spec") == spec_keys   # each renamed where it stood
    assert all(where[:2] == ("evidence", "diagnosis") for where in _keys_named(dumped, "kv_cache_dtype"))
    for name, cell in results.evidence.cells.items():
        assert cell.kv_spec == raw["evidence"]["cells"][name]["kv_cache_dtype"]


def test_a_version_2_results_with_tasks_reads_with_kv_spec():
    results = files.load("results", REPORTS / "h200-smollm2-8192-defaults/results.json.gz")
    evidence = results.evidence
    assert {name: cell.kv_spec for name, cell in evidence.cells.items()} == {"auto-8192": "auto", "fp8-8192": "fp8"}
    assert {row.kv_spec for row in evidence.pools} == {"fp8"}
    assert {row.kv_spec for row in evidence.startup} == {row.kv_spec for row in evidence.tasks.sample_rows} == {"auto", "fp8"}
    assert [d.kv_cache_dtype for d in evidence.diagnosis.values()] == ["fp8"]


def test_upgrading_changes_the_data_in_place_and_only_once():
    raw = _read(OLD_CPU / "cells/fp8-2048.json")
    assert files.upgrade("cell", raw) is raw and raw["schema_version"] == files.CELL_VERSION and "kv_spec" in raw
    again = copy.deepcopy(raw)
    assert files.upgrade("cell", again) == raw   # a current file is left as it is


def test_a_run_directorys_version_1_cell_is_read_by_key_as_kv_spec(tmp_path):
    from kveval.files.rundir import RunDir

    run = RunDir(tmp_path)
    run.cells_dir.mkdir()
    run.cell_path("fp8-2048").write_bytes((OLD_CPU / "cells/fp8-2048.json").read_bytes())
    for validate in (True, False):
        facts = run.load_cell("fp8-2048", validate=validate)
        assert (facts["schema_version"], facts["kv_spec"]) == (files.CELL_VERSION, "fp8") and "kv_cache_dtype" not in facts


def test_a_current_file_with_the_old_key_is_refused_not_renamed(tmp_path):
    def change(d):
        d.update(schema_version=files.CELL_VERSION)   # claims version 2, still says kv_cache_dtype
    path = _damaged(tmp_path, OLD_CPU / "cells/fp8-2048.json", change)
    message = _error("cell", path)
    assert "field kv_spec: missing (required)" in message
    assert "field kv_cache_dtype: not a field this kveval knows" in message


@pytest.mark.parametrize("kind,source,version", [
    ("cell", OLD_CPU / "cells/fp8-2048.json", 0), ("cell", OLD_CPU / "cells/fp8-2048.json", 3),
    ("manifest", CPU / "manifest.json", 0), ("manifest", CPU / "manifest.json", 3),
    ("results", CPU / "results.json.gz", 1), ("results", CPU / "results.json.gz", 4),
])
def test_a_file_of_an_unknown_version_is_still_refused(tmp_path, kind, source, version):
    path = _damaged(tmp_path, source, lambda d: d.update(schema_version=version))
    expected = files.VERSIONS[files.KINDS[kind]]
    assert _error(kind, path).startswith(f"{path}: schema_version {version} — this kveval reads {expected} ")


# --- older files (written before the current format): expected to fail, naming the field -------------

@pytest.mark.parametrize("path", sorted(OLD_REPORTS.glob("h200-planted/*/results.json.gz")), ids=lambda p: p.parent.name)
def test_old_results_fail_naming_the_field(path):
    assert _error("results", path).startswith(f"{path}: schema_version 1 — this kveval reads 3")


def test_old_manifest_fails_naming_the_field():
    path = OLD_REPORTS / "h200-tasks/manifest.json"
    assert f"{path}: field task_data.files.2048.kveval_passkey.skipped: missing (required)" in _error("manifest", path)


# --- JSON Schema -----------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", list(files.KINDS))
def test_json_schema_generates(kind):
    schema = files.json_schema(kind)
    assert schema["type"] == "object" and schema["properties"]
    json.dumps(schema)


def test_results_json_schema():
    required = files.json_schema("results")["required"]
    assert {"schema_version", "verdict", "evidence"} <= set(required)


def test_old_results_version_is_named(tmp_path):
    # results.json of schema 1 (before the evidence held acceptance and sample outputs).
    path = _damaged(tmp_path, QWEN / "results.json.gz", lambda d: d.update(schema_version=1))
    assert "schema_version 1 — this kveval reads 3" in _error("results", path)


def test_cli_schema_command_prints_each_kind():
    from click.testing import CliRunner

    from kveval.cli.commands import cli

    for kind in files.KINDS:
        outcome = CliRunner().invoke(cli, ["schema", kind])
        assert outcome.exit_code == 0 and json.loads(outcome.output) == files.json_schema(kind)


def test_results_json_schema_validates_real_results_with_jsonschema():
    jsonschema = pytest.importorskip("jsonschema")
    schema = files.json_schema("results")
    for path in [CPU / "results.json.gz", QWEN / "results.json.gz"]:
        # The schema is the current version's: a published results.json (version 2) as it is read.
        jsonschema.validate(files.upgrade("results", json.loads(_text(path), parse_constant=lambda _: None)), schema)
