"""The review's recommendation section: per KV configuration, the longest context the run's KV budget
starts, the concurrency it holds, and the quality verdict beside it. Pure: evidence, verdict and
manifest in, markdown out.
"""
from __future__ import annotations

import pandas as pd

from kveval.analysis.cell_records import BASELINE_KV
from kveval.files import schema
from kveval.gate import Verdict
from kveval.render.markdown import fmt_float, fmt_int, table
from kveval.render.requests_at_once import capped, max_num_seqs_of


def recommendation_section(evidence: schema.Evidence, verdict: Verdict, manifest: schema.Manifest) -> str:
    """The planning answer: per KV configuration, the longest context this budget starts, the
    concurrency it holds at the lengths run, and the quality verdict beside it. Needs the capacity
    model (runs from issue 10 on); older runs show no such table."""
    capacity = evidence.capacity_model
    if not capacity:
        return ""
    limit = manifest.model.max_position_embeddings
    concurrency = {row.cell: row.max_concurrency for row in evidence.startup}
    rows = []
    for kv in dict.fromkeys(r.kv_spec for r in capacity):
        mine = sorted((r for r in capacity if r.kv_spec == kv), key=lambda r: r.max_model_len)
        predicted = max((r.predicted_max_model_len or 0 for r in mine), default=0)
        started = [r.max_model_len for r in mine if r.started]
        if predicted and not started:
            longest = f"{fmt_int(predicted)} predicted, but it started at none of the lengths run"
        elif predicted and limit and predicted > limit:
            # The pool it is predicted to hold is stated once, in the capacity section (issue 41).
            longest = f"{fmt_int(limit)} (the model's limit; predicted to fit this budget)"
        elif predicted:
            longest = f"{fmt_int(predicted)} (predicted)"
        else:
            longest = f"≥ {fmt_int(max(started))} (largest that started; not predicted)" if started else "none of the lengths run"
        held = ", ".join(f"{fmt_int(r.max_model_len)}: {fmt_float(concurrency.get(r.cell), 1)}×"
                         f"{capped(concurrency[r.cell], max_num_seqs_of(evidence, r.cell))}"
                         for r in mine if r.started and concurrency.get(r.cell)) or "—"
        judged = ", ".join(f"{verdict.cells[r.cell]} at {fmt_int(r.max_model_len)}" for r in mine
                           if r.cell in verdict.cells)
        rows.append({"KV configuration": kv, "longest max_model_len on this budget": longest,
                     "requests of max_model_len it holds": held,
                     "quality verdict": "baseline" if kv == BASELINE_KV else (judged or "not judged")})
    return "\n".join(["## Recommendation", "",
                      "What each configuration buys on this run's KV budget, with the quality verdict beside it.", "",
                      table(pd.DataFrame(rows))])
