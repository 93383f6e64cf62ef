"""Benchmark the demo: wall time on this machine and where it goes (not a test; prints figures).

    .venv/bin/python scripts/bench_demo.py [--out DIR]

Runs the same `kveval compare` as `make demo` into a fresh directory, then splits the wall time
into engine start-up, generation, scoring, long-context tasks, speed runs, the rest of each cell process (Python + vLLM import,
shutdown) and the parent's own work (model preparation, prompt building, report).
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

DEMO_ARGS = ["--kv", "fp8", "auto", "--max-model-len", "1024", "2048", "--kv-cache-memory", "40MiB",
             "--suite", "quick", "--enforce-eager"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="run directory (default: a temporary one)")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="kveval-bench-")) / "demo"
    if out.exists():
        shutil.rmtree(out)
    kveval = Path(sys.executable).with_name("kveval")
    began = time.perf_counter()
    done = subprocess.run([str(kveval), "compare", *DEMO_ARGS, "--out", str(out)])
    if done.returncode not in (0, 1, 3, 4):  # the verdict's codes (PASS, FAIL, INCONCLUSIVE, a found one passes): "review written"
        return done.returncode
    wall = time.perf_counter() - began

    manifest = json.loads((out / "manifest.json").read_text())
    totals = {"engine start-up": 0.0, "generation": 0.0, "teacher-forced scoring": 0.0,
              "long-context tasks (lm-eval)": 0.0, "speed runs": 0.0, "cell process other (imports, exit)": 0.0}
    print(f"\nDemo wall time: {wall:.1f} s on {manifest['hardware']['cpu']}, {manifest['hardware']['cores']} cores "
          f"(CPU flags: {' '.join(manifest['hardware']['cpu_flags'])})\n")
    print(f"{'cell':<12}{'started':>9}{'process s':>11}{'start-up s':>12}{'generation s':>14}{'scoring s':>11}"
          f"{'tasks s':>9}{'speed s':>9}")
    for planned in manifest["cells"]:
        cell = json.loads((out / "cells" / f"{planned['id']}.json").read_text())
        process = cell.get("process", {}).get("seconds", 0.0)
        startup = cell.get("startup_seconds") or 0.0
        generation = (cell["phases"].get("generation") or {}).get("seconds", 0.0)
        speed = (cell["phases"].get("speed") or {}).get("seconds", 0.0)
        scoring = (cell["phases"].get("scoring") or {}).get("seconds", 0.0)
        tasks = (cell["phases"].get("tasks") or {}).get("seconds", 0.0)
        totals["long-context tasks (lm-eval)"] += tasks
        totals["engine start-up"] += startup
        totals["generation"] += generation
        totals["speed runs"] += speed
        totals["teacher-forced scoring"] += scoring
        totals["cell process other (imports, exit)"] += max(0.0, process - startup - generation - scoring - tasks - speed)
        print(f"{planned['id']:<12}{str(cell['started']):>9}{process:>11.1f}{startup:>12.1f}{generation:>14.1f}"
              f"{scoring:>11.1f}{tasks:>9.1f}{speed:>9.1f}")
    totals["parent (model, prompts, report)"] = max(0.0, wall - sum(totals.values()))
    print("\nShare of wall time:")
    for name, seconds in totals.items():
        print(f"  {name:<34}{seconds:>8.1f} s  {100 * seconds / wall:>5.1f} %")
    print(f"\nGoal: demo under 600 s -> {'met' if wall < 600 else 'NOT met'} ({wall:.0f} s). Run directory: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
