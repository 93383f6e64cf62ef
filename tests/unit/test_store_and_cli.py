"""Run-directory round trip and the CLI's handling of bad input (clean messages, no tracebacks)."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from kveval.cli.commands import cli
from kveval.files import schema
from kveval.files.rundir import RunDir, StoreError, write_json_atomic
from tests.support.constructed import failed_cell, planned_manifest


def test_cell_round_trip_and_planned_order(tmp_path):
    store = RunDir(tmp_path)
    manifest = planned_manifest([{"id": "auto-1024", "kv_spec": "auto", "max_model_len": 1024},
                                 {"id": "fp8-1024", "kv_spec": "fp8", "max_model_len": 1024}])
    write_json_atomic(store.manifest_path, manifest)
    cell = failed_cell("fp8", 1024, message="ünïcode ⏎")
    write_json_atomic(store.cell_path("fp8-1024"), cell)
    assert store.load_cells() == {"fp8-1024": cell}
    assert schema.dump(store.cell_results()["fp8-1024"]) == cell
    assert not list(store.cells_dir.glob(".*"))  # no temp files left behind
    # A key kveval does not know (a newer kveval's file) is refused, naming the file and the field.
    write_json_atomic(store.cell_path("fp8-1024"), {**cell, "text": "ünïcode ⏎"})
    for read in (store.load_cells, store.cell_results):
        with pytest.raises(StoreError, match=r"fp8-1024.json: field text: not a field this kveval knows"):
            read()


def test_wrong_schema_is_refused(tmp_path):
    write_json_atomic(RunDir(tmp_path).manifest_path, {"schema_version": 99})
    with pytest.raises(StoreError, match="schema_version"):
        RunDir(tmp_path).load_manifest()


def _clean_error(result, fragment):
    assert result.exit_code != 0
    assert "Traceback" not in result.output
    assert fragment in result.output


def test_report_on_missing_or_foreign_directory(tmp_path):
    runner = CliRunner()
    _clean_error(runner.invoke(cli, ["report", str(tmp_path / "nope")]), "no such run directory")
    _clean_error(runner.invoke(cli, ["report", str(tmp_path)]), "not a kveval run directory")
    (tmp_path / "manifest.json").write_text("{broken")
    _clean_error(runner.invoke(cli, ["report", str(tmp_path)]), "not valid JSON")


@pytest.mark.parametrize("args, fragment", [
    (["--kv"], "requires"),
    (["--max-model-len", "abc"], "abc"),
    (["--max-model-len", "32"], "too small"),
    (["--kv", "fp 8"], "not a KV-cache dtype"),
    (["--kv-cache-memory", "lots"], "lots"),
    (["--engine-arg", "novalue"], "novalue"),
    (["--gpu-memory-utilization", "1.5"], "gpu-memory-utilization"),
    (["--suite", "huge"], "huge"),
])
def test_compare_rejects_bad_options_cleanly(args, fragment, tmp_path):
    result = CliRunner().invoke(cli, ["compare", "--out", str(tmp_path / "o"), *args])
    _clean_error(result, fragment)


def test_compare_bad_prompt_file_and_model(tmp_path, default_model_dir):
    bad = tmp_path / "p.jsonl"
    bad.write_text('{"prompt": "ok"}\n{not json}\n')
    result = CliRunner().invoke(cli, ["compare", "--prompts", str(bad), "--out", str(tmp_path / "o")])
    _clean_error(result, "p.jsonl:2")
    result = CliRunner().invoke(cli, ["compare", "--model", str(tmp_path), "--out", str(tmp_path / "o2")])
    _clean_error(result, "config.json")


def test_a_huge_prompt_file_or_a_prompt_no_cell_can_take_is_refused_before_any_engine(tmp_path, default_model_dir):
    from kveval.inputs.workloads import MAX_USER_PROMPTS

    huge = tmp_path / "huge.jsonl"
    with huge.open("w") as handle:
        for i in range(100_000):
            handle.write(json.dumps({"prompt": f"What is {i} plus {i}?"}) + "\n")
    result = CliRunner().invoke(cli, ["compare", "--prompts", str(huge), "--out", str(tmp_path / "o")])
    _clean_error(result, f"huge.jsonl:{MAX_USER_PROMPTS + 1}: more than {MAX_USER_PROMPTS:,} prompts")
    assert not (tmp_path / "o").exists()   # refused before the run directory was made
    long = tmp_path / "long.jsonl"
    long.write_text(json.dumps({"prompt": "ok"}) + "\n" + json.dumps({"id": "essay", "prompt": "word " * 3000}) + "\n")
    result = CliRunner().invoke(cli, ["compare", "--prompts", str(long), "--max-model-len", "1024", "2048",
                                      "--out", str(tmp_path / "o")])
    _clean_error(result, "prompt 'essay' is 3,0")
    assert "more than the longest --max-model-len (2,048): no cell could take it" in result.output
    assert not (tmp_path / "o").exists()


def test_compare_refuses_to_overwrite_a_different_run(tmp_path, default_model_dir):
    out = tmp_path / "o"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    result = CliRunner().invoke(cli, ["compare", "--out", str(out)])
    _clean_error(result, "not empty")
    other = planned_manifest([])
    other["model"]["name"] = "other"
    write_json_atomic(RunDir(out).manifest_path, other)
    (out / "notes.txt").unlink()
    result = CliRunner().invoke(cli, ["compare", "--out", str(out)])
    _clean_error(result, "different settings")
    assert json.loads(RunDir(out).manifest_path.read_text())["model"]["name"] == "other"


def test_kv_without_auto_gets_the_baseline_added():
    from kveval.api import compare_options

    options = compare_options(kv=["FP8", "fp8:keep=0"], max_model_len=[1024])
    assert options.kv == ("fp8", "fp8:keep=0", "auto") and options.baseline_added
    assert not compare_options(kv=["auto", "fp8"], max_model_len=[1024]).baseline_added
