"""--baseline-from (issue 39) through the real orchestration with the fake engine (KVEVAL_ENGINE=fake): a
baseline run made first (`kveval baseline`, the `auto` cells only), made to look as if from another machine,
then an FP8-only run that imports its `auto` cells, starts no `auto` engine, reaches a verdict and names
where the baseline came from; and each way two runs can differ refused in one line before any engine."""
from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner

import kveval
from kveval.cli.commands import cli
from tests.support.fake_engine_env import fake_engine_dir
from tests.support.quiet import Quiet

COUNTS = {"short_256": 2, "short_512": 0, "probe": 100, "ctx_1k": 0, "ctx_pct": 0, "over": 1}
ARGS = dict(max_model_len=[1024], kv_cache_memory="60MiB", suite="quick", tasks=["none"], counts=COUNTS,
            phases=("generation", "scoring"), diagnose=False, progress=Quiet())
H200 = "NVIDIA H200, 143771 MiB, 570.00"


@pytest.fixture(scope="module")
def fake(tmp_path_factory):
    yield from fake_engine_dir(tmp_path_factory, "baseline-from")


@pytest.fixture(scope="module")
def baseline(fake, default_model_dir):
    """A baseline run (auto only), its manifest then edited to say it was made on an H200 with vLLM 0.26."""
    result = kveval.api.baseline(model=str(default_model_dir), out=fake / "baseline", **ARGS)
    path = result.run_dir / "manifest.json"
    manifest = json.loads(path.read_text(encoding="utf-8"))
    manifest["hardware"]["gpus"] = [H200]
    manifest["hardware"]["platform"] = {"platform": "cuda", "device_name": "NVIDIA H200", "device_capability": "9.0",
                                        "device_count": 1}
    manifest["versions"].update(vllm="0.26.0", vllm_distribution="vllm")
    path.write_text(json.dumps(manifest), encoding="utf-8")
    return result.run_dir


def test_the_baseline_run_holds_auto_cells_of_the_quality_phases_only(baseline):
    manifest = json.loads((baseline / "manifest.json").read_text(encoding="utf-8"))
    assert [c["kv_spec"] for c in manifest["cells"]] == ["auto"]
    assert manifest["options"]["phases"] == ["generation", "scoring"]
    assert manifest["fingerprints"]["tokenizer"] and manifest["fingerprints"]["chat_template"]


def test_fp8_run_with_an_imported_baseline_decides_and_names_its_origin(fake, baseline, default_model_dir):
    before = {p: p.read_bytes() for p in baseline.rglob("*") if p.is_file()}
    run = kveval.compare(model=str(default_model_dir), kv=["fp8"], out=fake / "fp8", baseline_from=baseline, **ARGS)
    assert {p: p.read_bytes() for p in baseline.rglob("*") if p.is_file()} == before   # the source is only read
    assert run.verdict.cells == {"fp8-1024": "PASS"}, [r.message for r in run.verdict.reasons]
    # Only the FP8 cell ran here: the auto cell is the copied one, recorded as imported.
    auto = json.loads((run.run_dir / "cells" / "auto-1024.json").read_text(encoding="utf-8"))
    assert auto == json.loads((baseline / "cells" / "auto-1024.json").read_text(encoding="utf-8"))
    imported = run.manifest.imported_baseline
    assert imported.cells == ["auto-1024"] and imported.cross_machine is True
    assert imported.origin.gpu == "NVIDIA H200" and imported.origin.profile == "gpu"
    # Quality only: no capacity, start-up, speed or time figure of this run comes from it.
    assert "auto-1024" not in {row.cell for row in run.evidence.startup}
    assert "auto-1024" not in {row.cell for row in run.evidence.timings}
    review = (run.run_dir / "review.md").read_text(encoding="utf-8")
    assert f"imported from {baseline}" in review and "NVIDIA H200" in review and "vLLM 0.26.0" in review
    assert "carries the difference between the two platforms" in review
    # CPU here against a GPU baseline: the wider (CPU) profile, widened by the baseline's own noise floor.
    assert run.verdict.profile.name == "cpu"
    assert [r.code for r in run.verdict.reasons].count("imported_baseline") == 1


BASE_CLI = ["--max-model-len", "1024", "--kv-cache-memory", "60MiB", "--suite", "quick", "--tasks", "none",
            "--phases", "generation", "scoring", "--no-diagnose"]


@pytest.fixture()
def refused(baseline, default_model_dir, tmp_path, monkeypatch):
    """`kveval compare --kv fp8 --baseline-from COPY` where COPY is the baseline run with one thing changed: the
    CLI's output lines, its exit code, and the run directory it would have used."""
    real = kveval.api.compare
    monkeypatch.setattr(kveval.api, "compare", lambda *a, **k: real(*a, counts=COUNTS, **k))

    def run(change=None, *extra):
        copy = tmp_path / "copy"
        shutil.copytree(baseline, copy)
        if change is not None:
            change(copy)
        result = CliRunner().invoke(cli, ["compare", "--model", str(default_model_dir), "--kv", "fp8", "--out",
                                          str(tmp_path / "run"), "--baseline-from", str(copy), *BASE_CLI, *extra])
        return [line for line in result.output.splitlines() if line.strip()], result.exit_code, tmp_path / "run"
    return run


def _manifest(path, *keys, value):
    def change(run_dir):
        file = run_dir / "manifest.json"
        manifest = json.loads(file.read_text(encoding="utf-8"))
        node = manifest
        for key in keys[:-1]:
            node = node[key]
        node[keys[-1]] = value
        file.write_text(json.dumps(manifest), encoding="utf-8")
    return change


def _first_token(name):
    def change(run_dir):
        file = run_dir / name
        items = json.loads(file.read_text(encoding="utf-8"))
        items[0]["token_ids"][0] += 1
        file.write_text(json.dumps(items), encoding="utf-8")
    return change


WEIGHTS = {"sha256": "0" * 64, "method": "files", "files": 1, "bytes": 1}


@pytest.mark.parametrize("change, extra, said", [
    (_manifest(None, "model", "weights", value=WEIGHTS), (), "weights differ"),
    (_manifest(None, "fingerprints", "tokenizer", value="0" * 16), (), "tokenizer differs"),
    (_manifest(None, "fingerprints", "chat_template", value="0" * 16), (), "chat template differs"),
    (None, ("--chat-template-kwargs", '{"enable_thinking": false}'), "chat template differs"),
    (_first_token("workloads.json"), (), "prompts differ by content (short_64-0)"),
    (_first_token("scoring.json"), (), "scoring documents differ by content"),
    (_manifest(None, "options", "seed", value=7), (), "seed differs (7 there, 0 here)"),
    (_manifest(None, "options", "suite", value="standard"), (), "sampling settings differ (suite 'standard' there"),
    (_manifest(None, "options", "phases", value=["generation"]), (), "phases scoring did not run there"),
    (None, ("--dtype", "float32"), "engine arguments differ (dtype=None there, 'float32' here)"),
    (lambda run_dir: (run_dir / "cells" / "auto-1024.json").unlink(), (),
     "no started auto cell there at max_model_len 1024"),
], ids=["weights", "tokenizer", "chat_template", "chat_template_kwargs", "prompts", "documents", "seed", "sampling",
        "phases", "engine_args", "lengths"])
def test_a_baseline_that_differs_is_refused_in_one_line_before_any_engine(refused, change, extra, said):
    lines, code, run_dir = refused(change, *extra)
    errors = [line for line in lines if line.startswith("Error:")]
    assert code == 2 and len(errors) == 1, lines
    assert "not comparable with this run" in errors[0] and said in errors[0], errors[0]
    assert not any("Traceback" in line for line in lines)
    assert not (run_dir / "cells").exists()   # no cell, so no engine, ever started


def test_a_directory_that_is_no_run_is_refused(refused, tmp_path):
    lines, code, _ = refused(lambda run_dir: (run_dir / "manifest.json").unlink())
    assert code == 2 and [line for line in lines if line.startswith("Error:")] == [
        f"Error: --baseline-from {tmp_path / 'copy'}: no kveval run there (no manifest.json)"]


def test_the_baseline_command_is_compare_with_auto_only(default_model_dir, tmp_path, monkeypatch):
    seen = {}
    monkeypatch.setattr(kveval.api, "compare", lambda *args, **kwargs: seen.update(args=args, kwargs=kwargs))
    CliRunner().invoke(cli, ["baseline", "--model", "m", "--max-model-len", "1024", "2048", "--out", str(tmp_path)])
    assert seen["args"] == ("m", ("auto",), (1024, 2048))
    assert seen["kwargs"]["phases"] == ("generation", "scoring", "tasks") and seen["kwargs"]["remedy"] == "off"
    assert seen["kwargs"]["budget"] == "0" and seen["kwargs"]["diagnose"] is False
