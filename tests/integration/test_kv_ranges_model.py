"""The per-layer KV range diagnosis on the real default model (transformers, CPU; no vLLM).

tests/support/planted.py scales layers 3 and 17's K projection by 128 and Q by 1/128: bf16
behaviour is unchanged, but those layers' K leave the FP8 e4m3 range (±448). Measured through
the CLI in a child process, exactly those two layers must be flagged and planned to stay out of
FP8; the healthy model must have none. About 30 s on 2 free cores.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kveval.analysis.kv_range import diagnose, plan_keep_layers
from kveval.inputs.models import default_model_info
from tests.support.planted import plant

pytestmark = pytest.mark.engine  # the real model's forward pass: the slow suite (make test), not make unit

REPO = Path(__file__).resolve().parents[2]
PLANTED_LAYERS = [3, 17]
TOKENS = 512


@pytest.fixture(scope="module")
def model_dir() -> Path:
    info = default_model_info()
    if not info.ready:
        pytest.skip(f"default model not converted at {info.path} (run kveval once, or prepare_default_model())")
    return Path(info.path)


@pytest.fixture(scope="module")
def documents(model_dir, tmp_path_factory) -> Path:
    """~512 tokens of the repository's own corpus, in scoring.json's format (the `tokenizers`
    library directly: importing transformers here would cost seconds)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    text = (REPO / "data" / "corpus" / "lighthouses.txt").read_text()
    ids = tokenizer.encode(text).ids[:TOKENS]
    assert len(ids) == TOKENS
    path = tmp_path_factory.mktemp("kv-docs") / "scoring.json"
    path.write_text(json.dumps([{"id": "doc:0", "kind": "document", "token_ids": ids}]))
    return path


def start(model: Path, documents: Path, out: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "kveval.worker.kv_ranges", "--model", str(model), "--documents", str(documents),
         "--out", str(out), "--device", "cpu"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
        env={**os.environ, "OMP_NUM_THREADS": "1"})  # two at once: one thread each, no oversubscription


def finish(process: subprocess.Popen, out: Path) -> dict:
    try:
        _, stderr = process.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        process.kill()
        raise
    assert process.returncode == 0, stderr[-2000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def measured(model_dir, documents, tmp_path_factory) -> dict:
    """Both models measured by the CLI, in two child processes at once (their start-up overlaps)."""
    root = tmp_path_factory.mktemp("kv-ranges")
    dst = plant(model_dir, root / "planted", tensor="k", factor=128.0, layers=PLANTED_LAYERS)
    runs = {"healthy": (model_dir, root / "healthy.json"), "planted": (dst, root / "planted.json")}
    processes = {name: start(model, documents, out) for name, (model, out) in runs.items()}
    return {name: finish(processes[name], runs[name][1]) for name in runs}


@pytest.fixture(scope="module")
def healthy(measured) -> dict:
    return measured["healthy"]


@pytest.fixture(scope="module")
def planted(measured) -> dict:
    return measured["planted"]


def test_measurement_covers_every_layer_and_token(healthy):
    facts, measured = healthy["model"], healthy["measurement"]
    assert healthy["schema_version"] == 1
    assert (facts["num_layers"], facts["num_kv_heads"], facts["head_dim"], facts["dtype"]) == (30, 3, 64, "bfloat16")
    assert measured["tokens"] == TOKENS and measured["documents_used"] == 1 and measured["device"] == "cpu"
    assert [layer["layer"] for layer in healthy["layers"]] == list(range(30))
    for layer in healthy["layers"]:
        for tensor in ("k", "v"):
            stats = layer[tensor]
            assert stats["count"] == TOKENS * 3 * 64 and not stats["sampled"]
            assert 0 < stats["p50"] <= stats["p99"] <= stats["p99_9"] <= stats["p99_99"] <= stats["absmax"]
            assert len(stats["absmax_per_head"]) == 3 and max(stats["absmax_per_head"]) == stats["absmax"]


def test_healthy_model_stays_within_fp8(healthy):
    diagnosis = diagnose(healthy)
    assert diagnosis["offending_layers"] == [] and plan_keep_layers(diagnosis) == []
    assert diagnosis["calibrated"] is False
    assert 0 < diagnosis["worst_ratio"] < 0.2  # SmolLM2's |K| peaks near 20, far below 448


def test_planted_layers_are_exactly_the_offending_ones(planted, healthy):
    diagnosis = diagnose(planted)
    assert diagnosis["offending_layers"] == PLANTED_LAYERS
    assert plan_keep_layers(diagnosis) == PLANTED_LAYERS
    assert {(o["layer"], o["tensor"]) for o in diagnosis["offending"]} == {(3, "k"), (17, "k")}
    assert all(o["share_over"] > 0.01 for o in diagnosis["offending"])
    # The planted K is the healthy one times 128 (a power of two: exact in bf16); V is untouched.
    for layer in PLANTED_LAYERS:
        assert planted["layers"][layer]["k"]["absmax"] == pytest.approx(
            128 * healthy["layers"][layer]["k"]["absmax"], rel=0.02)
        assert planted["layers"][layer]["v"]["absmax"] == pytest.approx(
            healthy["layers"][layer]["v"]["absmax"], rel=0.05)


def test_the_pass_forked_from_the_runs_fork_server_measures_what_its_own_process_does(model_dir, documents, tmp_path):
    """run/diagnosis.py forks the pass from the fork server, which imported vLLM and torch: nothing that
    import set may change a range."""
    from types import SimpleNamespace

    from kveval.files.rundir import RunDir
    from kveval.inputs.model_config import ModelSource
    from kveval.run import diagnosis
    from kveval.run.cell_process import cell_env
    from kveval.run.fork_server import ForkServer

    runs = {name: RunDir(tmp_path / name) for name in ("alone", "forked")}
    for run in runs.values():
        run.path.mkdir()
        run.scoring_path.write_bytes(documents.read_bytes())
    source, quiet = ModelSource(path=str(model_dir)), SimpleNamespace(note=lambda message: None)
    diagnosis.run_diagnosis(runs["alone"], source, None, quiet)
    with ForkServer(tmp_path / "server", lm_eval=False) as server:
        server.prestart(cell_env())
        assert server.wait_ready(300)
        assert "libtorch" in Path(f"/proc/{server.server.process.pid}/maps").read_text()   # torch imported there
        diagnosis.run_diagnosis(runs["forked"], source, None, quiet, fork=(server, cell_env()))
        assert list(server.server.exits.values()) == [0]   # one job, forked
    alone, forked = (json.loads(run.kv_ranges_path.read_text()) for run in runs.values())
    assert "error" not in forked and alone["measurement"].pop("seconds") and forked["measurement"].pop("seconds")
    assert forked == alone
