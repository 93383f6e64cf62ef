"""The review's first table: per tested cell (KV configuration × max_model_len) the verdict and what it
buys and costs against `auto` — KV pool and requests held, throughput, task accuracy with its bound,
divergence against its budget — so the first screen answers. Pure: verdict and evidence in, markdown out;
every figure is one the evidence or the verdict already holds."""
from __future__ import annotations

import pandas as pd

from kveval.analysis.cell_records import BASELINE_KV
from kveval.files import schema
from kveval.gate import Verdict
from kveval.render.markdown import fmt_int, fmt_share, fmt_sig, table
from kveval.render.requests_at_once import capped, max_num_seqs_of


def _baseline_pool(evidence: schema.Evidence, length: int) -> int | None:
    """The measured `auto` pool at this length (a quality reference's pool is no capacity figure)."""
    for facts in evidence.cells.values():
        if (facts.kv_spec == evidence.baseline_kv and facts.max_model_len == length
                and facts.started and facts.reference_for is None):
            return facts.kv_pool_tokens
    return None


def _pool(evidence: schema.Evidence, facts: schema.EvidenceCell, cell: str) -> str:
    if facts.missing:
        return "no result"
    if not facts.started:
        return f"did not start ({facts.failure_reason or 'see Start-up'})"
    pool = facts.kv_pool_tokens
    if not pool:
        return "–"
    requests = pool / facts.max_model_len
    base = _baseline_pool(evidence, facts.max_model_len)
    ratio = f" = {pool / base:.2f}× {evidence.baseline_kv}" if base else ""
    at_once = capped(requests, max_num_seqs_of(evidence, cell))
    return f"{fmt_int(pool)} tokens{ratio}; {requests:,.1f} requests of {facts.max_model_len:,}{at_once}"


def _throughput(evidence: schema.Evidence, cell: str) -> str:
    """Output tokens/s against the baseline at the highest concurrency both ran."""
    rows = [row for row in evidence.throughput or [] if row.cell == cell and row.output_tok_s_vs_baseline is not None]
    if not rows:
        return "–"
    top = max(rows, key=lambda row: row.concurrency or 0)
    interval = ""
    if top.vs_baseline_low is not None and top.vs_baseline_high is not None:   # issue 41's repeats
        short = f", {100 * top.vs_baseline_confidence:.0f} %" if (top.vs_baseline_confidence or 0) < 0.95 - 1e-9 else ""
        interval = f" ({top.vs_baseline_low:.2f}–{top.vs_baseline_high:.2f}{short})"
    return f"{top.output_tok_s_vs_baseline:.2f}×{interval} at {fmt_int(top.concurrency)} concurrent"


def _check(verdict: Verdict, cell: str, name: str):
    return next((c for c in verdict.checks if c.cell == cell and c.name == name), None)


def _tasks(evidence: schema.Evidence, verdict: Verdict, cell: str) -> str:
    tasks = evidence.tasks
    result = tasks.cells.get(cell) if isinstance(tasks, schema.TaskEvidence) else None
    if result is None or not result.n:
        return "not run" if not evidence.tasks_planned else "not judged"
    text = f"{fmt_share(result.baseline_accuracy)} → {fmt_share(result.cell_accuracy)} (n {result.n:,})"
    bound = _check(verdict, cell, "task_noninferiority")
    if bound is not None and bound.value is not None:
        text += f"; recovery ≥ {fmt_share(bound.value)}"
    return text


def _divergence(verdict: Verdict, cell: str) -> str:
    kl = _check(verdict, cell, "kl_mean")
    if kl is None or kl.value is None:
        return "–"
    # The check holds the limit that decided it: the healthy budget when it passed, the harm limit when it failed.
    if kl.passed is True:
        return f"KL {fmt_sig(kl.value)} ≤ {fmt_sig(kl.limit)} (healthy)"
    if kl.passed is False:
        return f"KL {fmt_sig(kl.value)} > {fmt_sig(kl.limit)} (harm)"
    return f"KL {fmt_sig(kl.value)} (limit {fmt_sig(kl.limit)})"


def decision_table(verdict: Verdict, evidence: schema.Evidence) -> str:
    """One row per tested cell, in the verdict's order; empty when nothing besides the baseline was judged."""
    rows = []
    for cell, status in verdict.cells.items():
        facts = evidence.cells.get(cell)
        if facts is None or facts.kv_spec == BASELINE_KV:
            continue
        rows.append({"cell": cell, "verdict": f"**{status}**", "KV pool (× auto)": _pool(evidence, facts, cell),
                     "throughput × auto": _throughput(evidence, cell),
                     "task accuracy auto → cell": _tasks(evidence, verdict, cell),
                     "divergence": _divergence(verdict, cell)})
    return table(pd.DataFrame(rows), names=("cell",)) if rows else ""
