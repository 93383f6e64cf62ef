"""The review's start-up section: the KV pool per max_model_len against the baseline, each cell's
start-up, and why cells did not start or crashed, with links to their engine logs. Pure: evidence
in, markdown out.
"""
from __future__ import annotations

import pandas as pd

from kveval.analysis.capacity_model import pool_token_shift
from kveval.analysis.cell_records import BASELINE_KV
from kveval.files import schema
from kveval.files.rundir import RunDir
from kveval.render.markdown import escape_cell, fmt_float, fmt_int, long_table, rows_frame


# What to do about the start-up failures whose cause lies outside the cell (a re-run redoes these).
_REASON_ADVICE = {
    "shared_device": "**another process used this device while vLLM measured its memory**: give kveval the "
                     "device alone (one run per GPU), then re-run the same command to redo these cells",
    "interrupted": "re-run the same command to redo these cells",
    "executor_lost": "the Ray task that ran the cell died (its node or worker went away): re-run the same command "
                     "to redo these cells",
}

LOG_LINE_START = "Engine logs of the cells that did not start or crashed: "
_ESTIMATE = "vLLM's estimate"   # a pool vLLM logged or estimated for a cell that did not start


def startup_section(evidence: schema.Evidence) -> str:
    out = ["## Start-up and KV pool", ""]
    if not evidence.startup:
        return "\n".join(out + ["_No cell has a result yet._"])
    pools = rows_frame(evidence.pools)
    if not pools.empty:
        # Ratios only: each cell's pool in tokens is in the per-cell table below (each figure stated once, issue 41).
        view = pd.DataFrame({
            "max_model_len": pools.max_model_len.map(fmt_int),
            "KV dtype": pools.kv_spec.fillna(""),
            f"ratio vs {BASELINE_KV}": pools.ratio.map(lambda r: f"{r:.2f}×" if r is not None and not pd.isna(r) else ""),
            "did not start": pools.not_started,
        })
        out += [long_table(view, f"{len(view)} pools: each max_model_len and KV dtype"), ""]
        fallback = pools[pools.fallback_ratio.notna()]
        for row in fallback.itertuples():
            out.append(_fallback_line(row))
        if not fallback.empty:
            out.append("")
    startup = rows_frame(evidence.startup)
    view = pd.DataFrame({
        "cell": startup.cell,
        "started": startup.started.map(lambda s: "yes" if s else "**no**"),
        "start-up s": startup.startup_s.map(lambda v: fmt_float(v, 1)),
        "KV pool tokens": startup.kv_pool_tokens.map(fmt_int),
        "KV blocks": startup.num_blocks.map(fmt_int) if "num_blocks" in startup else "",
        "max concurrency": startup.max_concurrency.map(lambda v: fmt_float(v, 2) + "×" if fmt_float(v) else ""),
        "backend": startup.attention_backend.fillna(""),
        "reason": startup.reason.fillna(""),
        "vLLM estimated max length": startup.estimated_max_model_len.map(fmt_int),
    })
    out += [long_table(view, f"{len(view)} cells")]
    out += _hybrid_pool_note(evidence.startup)
    failed = startup[~startup.started]
    if not failed.empty:
        out += ["", "Why cells did not start, in vLLM's own words:", ""]
        for (reason, message), group in failed.groupby(["reason", "message"], sort=False, dropna=False):
            advice = _REASON_ADVICE.get(reason)
            out.append(f"- **{', '.join(group.cell)}** — `{reason}`: {escape_cell(message, 600)}"
                       + (f" — {advice}" if advice else ""))
    crashed = startup[startup.crash.notna()]
    advice = startup["crash_advice"] if "crash_advice" in startup else pd.Series([None] * len(startup))
    for index, row in zip(crashed.index, crashed.itertuples()):
        what_now = advice.get(index) if isinstance(advice.get(index), str) else None
        out.append(f"- **{row.cell}** started, then its process died: {escape_cell(row.crash, 300)} "
                   "(phases finished before the crash are kept)" + (f". {escape_cell(what_now, 300)}." if what_now else ""))
    troubled = list(dict.fromkeys([*failed.cell, *crashed.cell]))
    if troubled:
        out += ["", LOG_LINE_START + ", ".join(f"[{name}]({RunDir.CELLS_DIR}/{name}.log)" for name in troubled)
                + " (vLLM's whole output; in the run directory)"]
    return "\n".join(out)


def _fallback_line(row) -> str:
    """A length where a cell did not start: its ratio rests on vLLM's estimate, and each figure says
    whether it was measured or is that estimate, so an estimate is never read as a measured pool."""
    def figure(measured, tokens) -> str:
        return f"{fmt_int(tokens)} ({'measured' if measured is not None and not pd.isna(measured) else _ESTIMATE})"

    cells = "a cell" if row.not_started.count(" (") == 1 else "cells"
    return (f"- At max_model_len {row.max_model_len:,} {cells} did not start, so this ratio rests on {_ESTIMATE} "
            f"({row.fallback_sources}): {BASELINE_KV} {figure(row.baseline_pool_tokens, row.baseline_fallback_tokens)} "
            f"vs {row.kv_spec} {figure(row.pool_tokens, row.fallback_tokens)} tokens, {row.fallback_ratio:.2f}×.")


def _hybrid_pool_note(startup: list[schema.StartupRow]) -> list[str]:
    """Same dtype, same blocks, different token figures (analysis.capacity_model.pool_token_shift)."""
    shift = pool_token_shift(startup)
    if shift is None:
        return []
    kv, blocks = shift
    return ["", f"Note: the `{kv}` cells hold the same {fmt_int(blocks)} KV blocks at every "
                "max_model_len, yet vLLM reports different token counts. For models with sliding-window "
                "(hybrid) layers vLLM's token figure is max concurrency × max_model_len, not a memory size: "
                "compare blocks, or the ratio at the same max_model_len."]
