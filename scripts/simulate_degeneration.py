"""How often the degeneration gate decides, by simulation: PASS / FAIL / INCONCLUSIVE rates of the rule in
kveval/gate/ (degeneration_checks.py) under the sequential design of run/rounds.py (first look 109 judged outputs, each round
doubling them up to --budget's 600, every look at the alpha it may spend, the last one final).

Loops are drawn independently per prompt in the cell and its baseline (the worst case for the test:
real loops mostly hit the same prompts in both). The figures in docs/statistics.md come from

    python scripts/simulate_degeneration.py --runs 2000
"""
from __future__ import annotations

import argparse

import numpy as np

from kveval.files import schema
from kveval.gate import FAIL, INCONCLUSIVE, PASS, Thresholds, _Collector, _degeneration

LOOKS = (109, 218, 436, 600)


def judge(new: int, base_only: int, looks: list[int], final: bool, t: Thresholds) -> str:
    out = _Collector()
    n = looks[-1]
    entry = schema.DegenerationCell(kv_cache_dtype="fp8", max_model_len=0, outputs=n, new_degenerate=new,
                                    judged_outputs=n, outputs_with_findings=new, detectors={}, token_limit_rate=None,
                                    baseline_only_degenerate=base_only, looks=list(looks), n_max=LOOKS[-1],
                                    final=final)
    _degeneration(out, "cell", entry, t)
    levels = out.levels("cell")
    return FAIL if FAIL in levels else INCONCLUSIVE if INCONCLUSIVE in levels else PASS


def one_run(rng: np.random.Generator, auto_rate: float, cell_rate: float, t: Thresholds,
            looks: tuple[int, ...]) -> tuple[str, int]:
    new = base_only = done = 0
    for k, n in enumerate(looks):
        added = n - done
        cell = rng.random(added) < cell_rate
        auto = rng.random(added) < auto_rate
        new += int((cell & ~auto).sum())
        base_only += int((auto & ~cell).sum())
        done = n
        verdict = judge(new, base_only, list(looks[:k + 1]), k == len(looks) - 1, t)
        if verdict != INCONCLUSIVE:
            return verdict, n
    return INCONCLUSIVE, looks[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    t, rng = Thresholds(), np.random.default_rng(args.seed)
    cases = [(0.05, 0.05), (0.10, 0.10), (0.20, 0.20), (0.05, 0.10), (0.10, 0.15), (0.05, 0.15), (0.10, 0.20),
             (0.20, 0.30), (0.05, 0.20), (0.05, 0.25)]
    print(f"{'auto':>5} {'cell':>5}  {'PASS':>6} {'FAIL':>6} {'INCONCL':>7}  mean outputs   (single look of 109: PASS FAIL)")
    for auto_rate, cell_rate in cases:
        outcomes = [one_run(rng, auto_rate, cell_rate, t, LOOKS) for _ in range(args.runs)]
        single = [one_run(rng, auto_rate, cell_rate, t, LOOKS[:1]) for _ in range(args.runs)]
        share = {v: sum(1 for o, _ in outcomes if o == v) / args.runs for v in (PASS, FAIL, INCONCLUSIVE)}
        once = {v: sum(1 for o, _ in single if o == v) / args.runs for v in (PASS, FAIL)}
        mean_n = sum(n for _, n in outcomes) / args.runs
        print(f"{auto_rate:5.2f} {cell_rate:5.2f}  {share[PASS]:6.1%} {share[FAIL]:6.1%} {share[INCONCLUSIVE]:7.1%}  "
              f"{mean_n:12.0f}   ({once[PASS]:.1%} {once[FAIL]:.1%})")


if __name__ == "__main__":
    main()
