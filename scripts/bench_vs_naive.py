"""kveval against the pipeline a user would script, same coverage, side by side (prints figures).

    .venv/bin/python scripts/bench_vs_naive.py [--out DIR] [-- KVEVAL COMPARE ARGS...]

1. `kveval compare` (default: the demo's matrix, fp8 and auto at 1024 and 2048 on the embedded model,
   without the K/V range pass and the remedy, which the naive pipeline has no counterpart for).
2. The naive pipeline on the same cells and the same inputs (the prompts, scoring documents and task
   data kveval wrote): per cell a generation script, a teacher-forced scoring script, stock
   `lm_eval --model vllm` and a speed script (concurrency 1, then the throughput sweep), each a
   process that starts its own engine (scripts/naive_pipeline.py). A job whose engine does not start
   (FP8 on an AVX2-only CPU) fails as it would for the user, and the next one runs.

Prints both wall times, the ratio (goal <= 0.4) and kveval's own overhead: wall time outside engine
start-up and the phases' engine work (goal <= 5 %), split into the parent's work and the cell
processes' imports and exit.
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from naive_pipeline import tasks_command  # noqa: E402

DEMO_ARGS = ["--kv", "fp8", "auto", "--max-model-len", "1024", "2048", "--kv-cache-memory", "40MiB",
             "--suite", "quick", "--enforce-eager"]
SAME_COVERAGE = ["--no-diagnose", "--remedy", "off"]
NAIVE_JOBS = ["generate", "score", "tasks", "speed"]


def run_kveval(args: list[str], out: Path) -> float:
    began = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "kveval", "compare", *args, *SAME_COVERAGE, "--out", str(out)])
    if done.returncode not in (0, 1, 3):  # the verdict's codes all mean "review written"
        raise SystemExit(f"kveval compare exited {done.returncode}")
    return time.perf_counter() - began


def kveval_split(run: Path, wall: float) -> dict:
    """Engine work (start-up + phases) and the rest, from the cell files' own timings."""
    manifest = json.loads((run / "manifest.json").read_text())
    engine = processes = 0.0
    for planned in manifest["cells"]:
        cell = json.loads((run / "cells" / f"{planned['id']}.json").read_text())
        process = (cell.get("process") or {}).get("seconds", 0.0)
        work = (cell.get("startup_seconds") or 0.0) + sum((p or {}).get("seconds", 0.0)
                                                           for p in cell["phases"].values())
        engine += work
        processes += process
    return {"engine": engine, "cell_other": max(0.0, processes - engine), "parent": max(0.0, wall - processes),
            "cells": [c["id"] for c in manifest["cells"]], "hardware": manifest["hardware"]}


def run_naive(run: Path, cells: list[str], out: Path) -> tuple[float, list[dict]]:
    script = Path(__file__).resolve().with_name("naive_pipeline.py")
    rows = []
    began = time.perf_counter()
    for cell in cells:
        for job in NAIVE_JOBS:
            command = (tasks_command(sys.executable, run, cell, out) if job == "tasks" else
                       [sys.executable, str(script), job, "--cell", cell, "--run", str(run), "--out", str(out)])
            start = time.perf_counter()
            with open(out / f"{job}-{cell}.log", "w") as log:
                code = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT).returncode
            rows.append({"cell": cell, "job": job, "seconds": time.perf_counter() - start, "exit": code})
            print(f"  naive {cell:<12} {job:<9} {rows[-1]['seconds']:7.1f} s  exit {code}", flush=True)
    return time.perf_counter() - began, rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="where both runs go (default: a temporary directory)")
    parser.add_argument("compare_args", nargs="*", help="kveval compare arguments (default: the demo's)")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="kveval-bench-"))
    shutil.rmtree(out, ignore_errors=True)
    (out / "naive").mkdir(parents=True)
    compare_args = args.compare_args or DEMO_ARGS

    print(f"kveval compare {' '.join(compare_args + SAME_COVERAGE)}", flush=True)
    kveval_wall = run_kveval(compare_args, out / "kveval")
    split = kveval_split(out / "kveval", kveval_wall)
    print(f"\nNaive pipeline, {len(NAIVE_JOBS)} processes per cell ({', '.join(NAIVE_JOBS)}):", flush=True)
    naive_wall, rows = run_naive(out / "kveval", split["cells"], out / "naive")

    hardware = split["hardware"]
    overhead = split["parent"] + split["cell_other"]
    gpus = [g.get("name", str(g)) if isinstance(g, dict) else str(g) for g in hardware.get("gpus") or []]
    print(f"\nOn {', '.join(gpus) or hardware.get('cpu')} ({hardware.get('cores')} CPU cores), "
          f"{len(split['cells'])} cells:")
    print(f"  kveval compare     {kveval_wall:8.1f} s")
    print(f"  naive pipeline     {naive_wall:8.1f} s  ({len(rows)} processes, one engine each)")
    ratio = kveval_wall / naive_wall
    print(f"  ratio              {ratio:8.2f}x  (goal <= 0.4: {'met' if ratio <= 0.4 else 'NOT met'})")
    print(f"  kveval engine work {split['engine']:8.1f} s  (start-up + phases, from the cell files)")
    print(f"  kveval overhead    {overhead:8.1f} s  = {100 * overhead / kveval_wall:.1f} % of wall "
          f"(goal <= 5 %: {'met' if overhead <= 0.05 * kveval_wall else 'NOT met'})")
    print(f"    parent (model check, prompts, task data, report)  {split['parent']:7.1f} s")
    print(f"    cell processes' Python + vLLM import and exit     {split['cell_other']:7.1f} s")
    (out / "bench.json").write_text(json.dumps({"kveval_wall": kveval_wall, "naive_wall": naive_wall, "ratio": ratio,
                                                "kveval": split, "naive": rows}, indent=1))
    print(f"\nBoth runs and bench.json: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
