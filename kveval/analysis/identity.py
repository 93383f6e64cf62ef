"""First output-identity summary: is each greedy output token-identical to the baseline's?"""
from __future__ import annotations

import pandas as pd

from kveval.analysis.cell_records import BASELINE_KV, baseline_for, generation_records


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """Index of the first differing token; None when identical (length included)."""
    for index, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return index
    return None if len(a) == len(b) else min(len(a), len(b))


def identity_pairs(workloads: list[dict], cells: dict[str, dict], baseline_kv: str = BASELINE_KV) -> pd.DataFrame:
    """One row per (prompt, cell) where both the cell and its baseline produced an output."""
    rows = []
    for name, facts in cells.items():
        base = baseline_for(cells, facts, baseline_kv)
        if base is None or not facts.get("started") or not base.get("started"):
            continue
        mine, theirs = generation_records(facts), generation_records(base)
        for prompt in workloads:
            a, b = mine.get(prompt["id"]), theirs.get(prompt["id"])
            if not (a and b and a.get("accepted") and b.get("accepted")):
                continue
            index = first_divergence(a["token_ids"], b["token_ids"])
            rows.append({"workload": prompt["workload"], "prompt": prompt["id"], "cell": name, "baseline": base["cell"],
                         "identical": index is None, "first_divergent_token": index,
                         "tokens": len(a["token_ids"]), "baseline_tokens": len(b["token_ids"])})
    return pd.DataFrame(rows, columns=["workload", "prompt", "cell", "baseline", "identical", "first_divergent_token",
                                       "tokens", "baseline_tokens"])


def identity_summary(pairs: pd.DataFrame) -> pd.DataFrame:
    """Per workload and cell: how many outputs are identical, and the earliest divergence."""
    if pairs.empty:
        return pairs
    grouped = pairs.groupby(["workload", "cell", "baseline"], sort=False)
    return grouped.agg(identical=("identical", "sum"), compared=("identical", "size"),
                       earliest_divergence=("first_divergent_token", "min")).reset_index()
