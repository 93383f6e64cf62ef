"""Replay the parent's look at the evidence (run/compare.py: read the manifest and every cell file, build the
evidence, judge it) on a finished run directory, and say where its time goes: three looks in one process
(the first with cold caches, as after a cell's file changed; the others with the RunDir caches warm), then
the cProfile of a cold look's top functions by cumulative time. For hosts where a look took far longer
than the same look replayed elsewhere (issue 18: 10 s on the H200 host, 1.7 s on the 2-core CPU).

    python scripts/profile_look.py RUN_DIR [--top N]
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time

from kveval.api import resolve_thresholds
from kveval.files.rundir import RunDir
from kveval.pipeline import stored_run_verdict


def look(path: str, thresholds, run: RunDir | None = None) -> RunDir:
    run = run or RunDir(path)
    manifest = run.manifest()
    stored_run_verdict(run, manifest, run.cell_results(manifest), thresholds)
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir")
    parser.add_argument("--top", type=int, default=35)
    args = parser.parse_args()
    thresholds = resolve_thresholds(None, None, None)
    began = time.perf_counter()
    run = look(args.run_dir, thresholds)
    seconds = [time.perf_counter() - began]
    for _ in range(2):
        began = time.perf_counter()
        look(args.run_dir, thresholds, run)
        seconds.append(time.perf_counter() - began)
    print("looks (cold, warm, warm):", ", ".join(f"{s:.2f} s" for s in seconds))
    profile = cProfile.Profile()
    profile.enable()
    look(args.run_dir, thresholds)
    profile.disable()
    out = io.StringIO()
    pstats.Stats(profile, stream=out).sort_stats("cumulative").print_stats(args.top)
    print(out.getvalue())


if __name__ == "__main__":
    main()
