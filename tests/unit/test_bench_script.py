"""scripts/bench_vs_naive.py's own bookkeeping (issue 18): the warm-up's arguments, the parent's split from
the manifest, and --redo-naive's rewrite of bench.json. The runs themselves are measured by `make bench`."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import bench_vs_naive as bench  # noqa: E402


def test_the_warm_up_replaces_the_options_it_sets_and_keeps_the_rest():
    args = ["--kv", "fp8", "auto", "--tasks", "passkey", "niah_single", "--enforce-eager", "--budget=20",
            "--phases", "generation", "tasks", "--suite", "quick", "--max-model-len", "1024"]
    assert bench._without(args, bench.WARM_UP_SETS) == ["--kv", "fp8", "auto", "--enforce-eager", "--suite", "quick",
                                                         "--max-model-len", "1024"]


def test_the_parent_split_reads_the_manifest_timing(tmp_path):
    timing = {"setup_seconds": 10.0, "diagnosis_seconds": None, "run_seconds": 200.0,
              "steps": {"looks": {"seconds": 12.0, "count": 4}, "cell_files": {"seconds": 3.0, "count": 4}}}
    (tmp_path / "manifest.json").write_text(json.dumps({"timing": timing}))
    parts = bench.parent_parts(tmp_path, wall=215.0, processes=150.0)
    assert parts == {"setup": 10.0, "diagnosis": 0.0, "between": 40.0, "steps": {"looks": 12.0, "cell_files": 3.0},
                     "between_rest": 25.0, "outside_run": 15.0}
    assert bench.parent_parts(tmp_path / "missing", 1.0, 0.0) == {}


def test_redo_naive_replaces_the_job_rows_and_moves_the_naive_wall_by_the_difference(tmp_path, monkeypatch):
    rows = [{"cell": "auto-8192", "job": "generate", "seconds": 40.0, "exit": 0},
            {"cell": "auto-8192", "job": "tasks", "seconds": 30.0, "exit": 1},
            {"cell": "fp8-8192", "job": "tasks", "seconds": 29.0, "exit": 1}]
    (tmp_path / "bench.json").write_text(json.dumps({"kveval_wall": 100.0, "naive_wall": 99.5, "ratio": 1.0,
                                                     "naive": rows}))
    fresh = [{"cell": "auto-8192", "job": "tasks", "seconds": 64.0, "exit": 0, "task_samples": 204},
             {"cell": "fp8-8192", "job": "tasks", "seconds": 61.0, "exit": 0, "task_samples": 204}]
    calls = []
    monkeypatch.setattr(bench, "run_naive", lambda run, out, only=None: calls.append(only) or (125.0, fresh))
    monkeypatch.setattr(bench, "show", lambda data: None)
    bench.redo_naive(tmp_path, "tasks")
    written = json.loads((tmp_path / "bench.json").read_text())
    assert calls == ["tasks"]
    assert written["naive_wall"] == pytest.approx(99.5 + (64.0 - 30.0) + (61.0 - 29.0))
    assert written["ratio"] == pytest.approx(100.0 / written["naive_wall"])
    assert written["naive"][0] == rows[0] and written["naive"][1:] == fresh
    assert [(r["cell"], r["before"]["exit"], r["after"]["exit"]) for r in written["redone"]] == [
        ("auto-8192", 1, 0), ("fp8-8192", 1, 0)]


def test_a_kveval_only_bench_prints_its_overhead_and_efficiency_and_no_ratio(capsys):
    published = json.loads((Path(__file__).resolve().parents[2] / "reports" / "cpu-bench-demo-avx512"
                            / "bench.json").read_text())
    bench.show({**published, "naive_skipped": True, "naive_wall": 0.0, "ratio": None, "naive": []})
    printed = capsys.readouterr().out
    assert "not run (--skip-naive)" in printed and "ratio " not in printed
    assert f"{published['kveval']['overhead']:8.1f} s" in printed and "Engine efficiency" in printed
