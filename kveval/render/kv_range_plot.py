"""The per-layer KV range figure: |K| and |V| of every layer against the FP8 limit (log scale).

Reads the evidence's `schema.Diagnosis` (kveval.analysis.kv_range.diagnose); matplotlib with the Agg
backend (no display).
"""
from __future__ import annotations

import io
from pathlib import Path

from kveval.files import schema
from kveval.files.rundir import write_bytes_atomic
from kveval.render.plots import DPI

COLOURS = {"k": "#1f77b4", "v": "#ff7f0e"}


def _series(rows: list[schema.RangeRow], tensor: str, figure) -> tuple[list[int], list[float]]:
    """(layers, values) of one tensor's figure (a function of the row), where it is positive."""
    mine = [(r.layer, figure(r)) for r in rows if r.tensor == tensor]
    mine = [(layer, value) for layer, value in mine if value is not None and value > 0]
    return [layer for layer, _ in mine], [value for _, value in mine]


def kv_range_plot(diagnosis: schema.Diagnosis | None, path) -> Path | None:
    """absmax (solid) and p99.9 (dotted) of |K| and |V| per layer, the FP8 limit as a line (a step
    per layer when the scales differ), offending layers shaded. None when there is nothing to draw."""
    rows = diagnosis.rows if diagnosis else []
    if not any(r.absmax for r in rows):
        return None

    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    layers = sorted({r.layer for r in rows})
    fig = Figure(figsize=(max(6.0, 0.22 * len(layers) + 2.5), 3.6), dpi=DPI, layout="constrained")
    ax = fig.subplots()
    for layer in diagnosis.offending_layers:
        ax.axvspan(layer - 0.5, layer + 0.5, color="#d62728", alpha=0.15, lw=0)
    for tensor in ("k", "v"):
        xs, ys = _series(rows, tensor, lambda r: r.absmax)
        ax.plot(xs, ys, marker="o", ms=3, lw=1.2, color=COLOURS[tensor], label=f"|{tensor.upper()}| max")
        xs, ys = _series(rows, tensor, lambda r: r.p99_9)
        ax.plot(xs, ys, ls=":", lw=1.2, color=COLOURS[tensor], label=f"|{tensor.upper()}| p99.9")
    limits = {(r.layer, r.tensor): r.limit for r in rows if r.limit}
    if limits:
        values = set(limits.values())
        name = diagnosis.kv_cache_dtype or "fp8"
        if len(values) == 1:
            ax.axhline(values.pop(), color="#d62728", lw=1.2, ls="--", label=f"{name} limit")
        else:
            for tensor, style in (("k", "--"), ("v", "-.")):
                xs = [layer for layer in layers if (layer, tensor) in limits]
                ax.step(xs, [limits[(layer, tensor)] for layer in xs], where="mid", color="#d62728", lw=1.0,
                        ls=style, label=f"{name} limit ({tensor.upper()})")
    ax.set_yscale("log")
    ax.set_xlabel("layer", fontsize=8)
    ax.set_ylabel("|value| in the KV cache", fontsize=8)
    ax.set_xlim(layers[0] - 0.6, layers[-1] + 0.6)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.tick_params(labelsize=7)
    tokens = diagnosis.tokens
    ax.set_title("Per-layer K/V range vs the FP8 range" + (f" ({tokens:,} tokens)" if tokens else ""), fontsize=9)
    ax.legend(fontsize=7, ncols=3, loc="best")
    ax.grid(True, which="major", axis="y", alpha=0.3)
    raw = io.BytesIO()
    fig.savefig(raw, format="png", metadata={"Software": None})
    path = Path(path)
    write_bytes_atomic(path, raw.getvalue())
    return path
