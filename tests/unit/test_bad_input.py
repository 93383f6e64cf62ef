"""Issue 11's bad-input cases, each: one clear sentence, exit 2, no traceback, before any engine starts."""
from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner

from kveval.cli.commands import cli
from kveval.files import schema
from kveval.files.rundir import RunDir, write_json_atomic
from kveval.run.resume import redo_reason
from kveval.run.vllm_vocabulary import check_against_vllm
from tests.support.constructed import complete_cell


def _stored(facts: dict) -> schema.CellResult:
    """A stored cell record with these parts (the rest filled in), typed as compare reads it back."""
    if "failure" in facts:
        facts["failure"] = {"estimated_max_model_len": None, "backend": None, **facts["failure"]}
    if "crash" in facts:
        facts["crash"] = {"last_log_line": "", **facts["crash"]}
    if "process" in facts:
        facts["process"] = {"exit_code": 1, "seconds": 1.0, **facts["process"]}
    return schema.parse(schema.CellResult, complete_cell(facts), "cell")

ROOT = Path(__file__).resolve().parents[2]
VOCABULARY = {"vllm_version": "0.32.0", "engine_args": ["dtype", "max_num_seqs", "trust_remote_code"],
              "kv_cache_dtypes": ["auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2"]}


def _refused(args: list[str], fragment: str) -> str:
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert fragment in result.output, result.output
    return result.output


@pytest.mark.parametrize("args, fragment", [
    (["--max-model-len", "-5"], "'-5' is negative"),
    (["--task-lengths=-0.5"], "task length -0.5 must be a share"),
    (["--cell-timeout", "0"], "--cell-timeout 0: give the seconds a cell may take"),
    (["--cell-timeout", "-1"], "--cell-timeout -1"),
    (["--stall-timeout", "0"], "--stall-timeout 0: give the seconds a started cell may go without progress"),
    (["--max-model-len", "1000000000"], "above 4,194,304 that alone would exhaust memory"),
    (["--threshold", "alpha=2"], "alpha is a share and must lie in [0, 1]"),
])
def test_options_refused_before_any_model_is_read(args, fragment, tmp_path):
    _refused(["compare", "--out", str(tmp_path / "o"), *args], fragment)
    assert not (tmp_path / "o").exists()


def test_a_length_over_the_models_limit_names_the_limit(tmp_path, default_model_dir):
    _refused(["compare", "--max-model-len", "100000", "--out", str(tmp_path / "o")],
             "over SmolLM2-135M-Instruct's limit of 8,192 tokens (max_position_embeddings 8,192)")


def test_default_lengths_over_the_limit_are_left_out_not_refused(default_model_dir):
    from kveval.run.plan import lengths_for_model

    kept, note = lengths_for_model((2048, 8192, 32768), False, (8192, "max_position_embeddings 8,192"), "M", False)
    assert kept == (2048, 8192) and "32,768 left out" in note
    assert lengths_for_model((32768,), True, (8192, "x"), "M", allow_long=True) == ((32768,), None)


def test_unknown_kv_dtype_and_engine_argument_name_what_vllm_knows():
    from kveval.errors import KvevalError

    with pytest.raises(KvevalError, match=r"--kv fp9: not a KV-cache dtype of vLLM 0.32.0; it knows auto, float16"):
        check_against_vllm(["fp9"], {}, VOCABULARY)
    with pytest.raises(KvevalError, match=r"no engine argument 'max_num_seq' \(did you mean max_num_seqs\?\)"):
        check_against_vllm(["fp8"], {"max_num_seq": 4}, VOCABULARY)
    check_against_vllm(["fp8", "auto"], {"max-num-seqs": 4}, VOCABULARY)   # dashes are vLLM's spelling too
    check_against_vllm(["fp9"], {"x": 1}, None)                            # no probe: vLLM will say it


@pytest.mark.engine  # imports the real vLLM in a child (no engine): the slow suite (make test)
def test_the_real_vllm_is_asked_what_it_accepts(tmp_path, monkeypatch):
    # The probe is a child process importing the installed vLLM (no engine); its answer is cached.
    from kveval.run.vllm_vocabulary import vllm_vocabulary

    monkeypatch.setenv("KVEVAL_HOME", str(tmp_path))
    vocabulary = vllm_vocabulary()
    assert vocabulary and {"fp8", "auto"} <= set(vocabulary["kv_cache_dtypes"])
    assert {"max_num_seqs", "kv_cache_memory_bytes", "trust_remote_code"} <= set(vocabulary["engine_args"])
    assert list(tmp_path.glob("vllm-vocabulary-*.json"))


def test_fp8_in_capitals_is_one_configuration_with_fp8():
    from kveval.api import compare_options

    assert compare_options(kv=["FP8", "fp8", "auto"], max_model_len=[1024]).kv == ("fp8", "auto")


def test_unwritable_or_file_out_is_refused(tmp_path):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    _refused(["compare", "--out", str(a_file)], "exists and is not a directory")
    _refused(["compare", "--out", str(a_file / "below")], "is a file, not a directory")
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        if os.access(locked, os.W_OK):  # root ignores permission bits
            pytest.skip("running as root: permission bits do not stop writes here")
        _refused(["compare", "--out", str(locked / "run")], "cannot write there")
        _refused(["tasks", "generate", "--max-model-len", "1024", "--out", str(locked / "data")], "cannot write there")
    finally:
        locked.chmod(stat.S_IRWXU)


def test_proc_is_not_a_place_for_a_run():
    _refused(["compare", "--out", "/proc/kveval-run", "--max-model-len", "1024"], "--out /proc/kveval-run: cannot write")


@pytest.mark.parametrize("content", ["[]", "{}"])
def test_a_cell_file_holding_no_record_is_named_by_gate(content, tmp_path):
    from tests.support.constructed import planned_manifest

    run = tmp_path / "run"
    store = RunDir(run)
    write_json_atomic(store.manifest_path, planned_manifest([{"id": "auto-1024", "kv_spec": "auto",
                                                              "max_model_len": 1024}]))
    store.cells_dir.mkdir(parents=True, exist_ok=True)
    store.cell_path("auto-1024").write_text(content)
    result = CliRunner().invoke(cli, ["gate", str(run)])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "cells/auto-1024.json" in result.output


def test_a_hub_id_without_a_reachable_hub_is_refused_at_once(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens on the discard port
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    _refused(["compare", "--model", "someone/some-model", "--out", str(tmp_path / "o")],
             "the Hugging Face Hub (127.0.0.1) cannot be reached from here")


def test_a_model_directory_without_weights_is_refused_before_any_engine(tmp_path, default_model_dir):
    # A config and a tokenizer only (a download cut short): every engine would fail to start on it.
    model = tmp_path / "model"
    model.mkdir()
    for part in default_model_dir.iterdir():
        if part.suffix != ".safetensors":
            (model / part.name).symlink_to(part)
    output = _refused(["compare", "--model", str(model), "--out", str(tmp_path / "o")],
                      "the directory has a config.json but no weights for vLLM to load (*.safetensors, *.bin, *.pt)")
    assert "engine" not in output.lower() and not (tmp_path / "o" / "cells").exists()


def test_hostile_prompt_ids_are_escaped_in_the_review():
    from kveval.render.markdown import escape_name

    hostile = "<script>alert(1)</script>`x`[a](javascript:b)\x1b[31m\x07\nnext"
    shown = escape_name(hostile)
    for raw in ("<script>", "`x`", "[a](", "\x1b", "\x07", "\n"):
        assert raw not in shown
    assert escape_name("short_64-0") == "short_64-0"


def test_resume_redoes_transient_failures_and_keeps_configuration_ones():
    def failed(reason, **process):
        return _stored({"complete": True, "started": False, "failure": {"reason": reason, "message": "m"},
                        "process": process})

    assert redo_reason(failed("unsupported_dtype"), retry_failed=False, budget_given=True) is None
    assert redo_reason(failed("kv_capacity"), retry_failed=False, budget_given=True) is None
    assert "may pass" in redo_reason(failed("oom"), retry_failed=False, budget_given=True)
    assert "may pass" in redo_reason(failed("shared_device"), retry_failed=False, budget_given=True)
    assert "timeout" in redo_reason(failed("other", timed_out=True), retry_failed=False, budget_given=True)
    assert "device's free memory" in redo_reason(failed("kv_capacity"), retry_failed=False, budget_given=False)
    assert "--retry-failed" in redo_reason(failed("unsupported_dtype"), retry_failed=True, budget_given=True)
    assert "crashed" in redo_reason(_stored({"complete": True, "started": True, "crash": {"message": "x"}}),
                                    retry_failed=False, budget_given=True)
    assert redo_reason(_stored({"complete": True, "started": True}), retry_failed=True, budget_given=True) is None


def test_a_different_run_in_out_is_named_and_fresh_moves_it_aside(tmp_path):
    from kveval.errors import KvevalError
    from kveval.run.resume import prepare_run_dir
    from tests.support.constructed import planned_manifest

    out = RunDir(tmp_path / "run")
    earlier = planned_manifest([])
    write_json_atomic(out.manifest_path, earlier)
    now = json.loads(json.dumps(earlier))
    now["options"]["seed"] = 7
    now["options"]["cell_timeout_s"] = 99.0   # how the run is carried out: a resume may change it
    with pytest.raises(KvevalError, match=r"different settings \(options.seed\)"):
        prepare_run_dir(out, now)
    same = json.loads(json.dumps(earlier))
    same["options"]["cell_timeout_s"] = 99.0
    assert prepare_run_dir(out, same) is True
    assert prepare_run_dir(out, now, fresh=True) is False
    moved = list(tmp_path.glob("run.replaced-*"))
    assert len(moved) == 1 and (moved[0] / "manifest.json").is_file()


def test_the_review_names_a_shared_device_and_links_the_logs_and_says_what_to_do_after_a_crash():
    from tests.support.constructed import failed_cell, manifest_for, started_cell
    from tests.support.review import review_of

    profiling = ("AssertionError: Error in memory profiling. Initial free memory 113.5 GiB, current free memory "
                 "133.61 GiB. This happens when other processes sharing the same container release GPU memory")
    crashed = started_cell("auto", 1024, 1792, [])
    crashed["crash"] = {"message": "the cell process was killed by SIGKILL (exit code -9), which kveval did not send",
                        "last_log_line": "", "cause": "oom_killed", "advice": "lower --kv-cache-memory"}
    cells = {"auto-1024": crashed, "fp8-1024": failed_cell("fp8", 1024, "shared_device", profiling)}
    review = review_of(manifest_for(cells), [], cells)
    assert "another process used this device while vLLM measured its memory" in review
    assert "[fp8-1024](cells/fp8-1024.log)" in review and "[auto-1024](cells/auto-1024.log)" in review
    assert "killed by SIGKILL" in review and "lower --kv-cache-memory." in review


def test_an_engine_argument_vllm_rejects_is_a_usage_error_not_a_finding():
    from kveval.run.cells import rejected_engine_arg

    facts = {"started": False, "failure": {"reason": "other", "message": "pydantic_core._pydantic_core.ValidationError: "
             "1 validation error for SchedulerConfig max_num_seqs Input should be greater than 0"}}
    assert rejected_engine_arg(_stored(dict(facts)), {"max_num_seqs": -1}) == "max_num_seqs=-1"
    assert rejected_engine_arg(_stored(dict(facts)), {"dtype": "float32"}) is None
    assert rejected_engine_arg(_stored({**facts, "started": True}), {"max_num_seqs": -1}) is None
    # vLLM 0.32 on this CPU: the header is the message; the field is named on the log lines below it.
    header = _stored({"started": False, "failure": {"reason": "other", "message": "pydantic_core._pydantic_core."
                                                    "ValidationError: 2 validation errors for SchedulerConfig"}})
    log = ("...\npydantic_core._pydantic_core.ValidationError: 2 validation errors for SchedulerConfig\n"
           "max_num_seqs\n  Input should be greater than or equal to 1 [type=greater_than_equal]")
    assert rejected_engine_arg(header, {"max_num_seqs": -1}, log) == "max_num_seqs=-1"


def test_a_resume_may_raise_the_budget_and_keeps_the_rounds_record_but_may_not_shrink_it(tmp_path):
    from kveval.errors import KvevalError
    from kveval.inputs.budget import parse_budget
    from kveval.run.resume import prepare_run_dir
    from tests.support.constructed import planned_manifest

    out = RunDir(tmp_path / "run")
    earlier = planned_manifest([])
    earlier["options"]["budget"] = parse_budget("200").to_dict()
    earlier["task_rounds"] = {"budget": earlier["options"]["budget"], "n_max": 200, "rounds": [], "final": ["fp8-1024"],
                              "stopped": "the budget of 200 paired samples per cell is spent", "notes": []}
    write_json_atomic(out.manifest_path, earlier)

    def now(budget):
        manifest = json.loads(json.dumps(earlier))
        manifest.pop("task_rounds")                      # set_up_run builds the manifest anew
        manifest["options"]["budget"] = parse_budget(budget).to_dict()
        return manifest

    larger = now("600,1h")
    assert prepare_run_dir(out, larger) is True
    assert larger["task_rounds"]["n_max"] == 200        # the design's record goes on (each look's N_max)
    for smaller in ("100", "off"):
        with pytest.raises(KvevalError, match=r"planned under --budget 200 paired samples per cell; --budget "
                                              rf"{smaller} would shrink that design"):
            prepare_run_dir(out, now(smaller))
    assert prepare_run_dir(out, now("100"), fresh=True) is False
    assert len(list(tmp_path.glob("run.replaced-*"))) == 1
