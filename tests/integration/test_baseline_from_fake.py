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
from tests.support.quiet import Quiet

COUNTS = {"short_256": 2, "short_512": 0, "probe": 100, "ctx_1k": 0, "ctx_pct": 0, "over": 1}
ARGS = dict(max_model_len=[1024], kv_cache_memory="60MiB", suite="quick", tasks=["none"], counts=COUNTS,
            phases=("generation", "scoring"), diagnose=False, progress=Quiet())
H200 = "NVIDIA H200, 143771 MiB, 570.00"


@pytest.fixture(scope="module")
def fake(tmp_path_factory):
    patch = pytest.MonkeyPatch()
    patch.setenv("KVEVAL_ENGINE", "fake")
    patch.delenv("KVEVAL_FAKE_DAMAGE", raising=False)
    patch.setenv("KVEVAL_NO_PLOTS", "1")
    yield tmp_path_factory.mktemp("baseline-from")
    patch.undo()


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
    imported = run.manifest["imported_baseline"]
    assert imported["cells"] == ["auto-1024"] and imported["cross_machine"] is True
    assert imported["origin"]["gpu"] == "NVIDIA H200" and imported["origin"]["profile"] == "gpu"
    # Quality only: no capacity, start-up, speed or time figure of this run comes from it.
    assert "auto-1024" not in {row.cell for row in run.evidence.startup}
    assert "auto-1024" not in {row.cell for row in run.evidence.timings}
    review = (run.run_dir / "review.md").read_text(encoding="utf-8")
    assert f"imported from {baseline}" in review and "NVIDIA H200" in review and "vLLM 0.26.0" in review
    assert "carries the difference between the two platforms" in review
    # CPU here against a GPU baseline: the wider (CPU) profile, widened by the baseline's own noise floor.
    assert run.verdict.profile["name"] == "cpu"
    assert [r.code for r in run.verdict.reasons].count("imported_baseline") == 1


def _refused(args, capsys=None):
    result = CliRunner().invoke(cli, args)
    lines = [line for line in result.output.splitlines() if line.strip()]
    return result, lines


BASE_CLI = ["--max-model-len", "1024", "--kv-cache-memory", "60MiB", "--suite", "quick", "--tasks", "none",
            "--phases", "generation", "scoring", "--no-diagnose"]


@pytest.fixture()
def copy(baseline, tmp_path):
    """A copy of the baseline run, to change one thing in."""
    target = tmp_path / "copy"
    shutil.copytree(baseline, target)
    return target


def _edit(run_dir, change):
    path = run_dir / "manifest.json"
    manifest = json.loads(path.read_text(encoding="utf-8"))
    change(manifest)
    path.write_text(json.dumps(manifest), encoding="utf-8")


def _counts(monkeypatch):
    monkeypatch.setenv("KVEVAL_TEST_COUNTS", json.dumps(COUNTS))


def _compare(default_model_dir, copy, tmp_path, *extra):
    from tests.support import tiny_compare

    return _refused(["compare", "--model", str(default_model_dir), "--kv", "fp8", "--out", str(tmp_path / "run"),
                     "--baseline-from", str(copy), *BASE_CLI, *extra])


def _set(path, value):
    def change(manifest):
        node = manifest
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
    return change


REFUSALS = {
    "weights": (_set(("model", "weights"), {"sha256": "0" * 64, "method": "x", "files": 1, "bytes": 1}), "weights differ"),
    "tokenizer": (_set(("fingerprints", "tokenizer"), "0" * 16), "tokenizer differs"),
    "chat_template": (_set(("fingerprints", "chat_template"), "0" * 16), "chat template differs"),
    "seed": (_set(("options", "seed"), 7), "seed differs (7 there, 0 here)"),
    "sampling": (_set(("options", "suite"), "standard"), "sampling settings differ (suite 'standard' there, 'quick' here)"),
    "lengths": (_set(("options", "max_model_len"), [2048]), None),
}


def _api_compare(default_model_dir, copy, tmp_path, **extra):
    return kveval.compare(model=str(default_model_dir), kv=["fp8"], out=tmp_path / "run", baseline_from=copy,
                          **{**ARGS, **extra})
