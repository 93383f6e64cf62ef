"""Figures for capacity and throughput: KV pool per max_model_len and dtype (measured and predicted),
and output tokens/s and TTFT against concurrency (matplotlib, Agg backend), from evidence rows."""
from __future__ import annotations

from pathlib import Path

from kveval.files import schema
from kveval.render.plots import DPI, save_png


def _figure(width: float, height: float, panels: int):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    return fig, fig.subplots(1, panels, squeeze=False)[0]


def capacity_plot(rows: list[schema.CapacityRow] | None, path: str | Path) -> Path | None:
    """KV pool tokens (log) per max_model_len: measured points and predicted lines per KV configuration;
    a cell that did not start is an open marker at its predicted pool. None when nothing was predicted."""
    rows = [r for r in rows or [] if r.predicted_tokens]
    if not rows:
        return None
    fig, (ax,) = _figure(5.5, 3.4, 1)
    for kv in dict.fromkeys(r.kv_spec for r in rows):
        mine = sorted((r for r in rows if r.kv_spec == kv), key=lambda r: r.max_model_len)
        lengths = [r.max_model_len for r in mine]
        line, = ax.plot(lengths, [r.predicted_tokens for r in mine], linestyle="--", linewidth=1, marker="x",
                        markersize=9, label=f"{kv} predicted")
        measured = [(r.max_model_len, r.measured_tokens) for r in mine if r.measured_tokens]
        if measured:
            ax.plot(*zip(*measured), marker="o", linestyle="none", color=line.get_color(), label=f"{kv} measured")
        failed = [(r.max_model_len, r.predicted_tokens) for r in mine if not r.started]
        if failed:
            ax.plot(*zip(*failed), marker="o", markerfacecolor="none", linestyle="none", color=line.get_color(),
                    label=f"{kv} did not start")
    lengths = sorted({r.max_model_len for r in rows})
    ax.plot(lengths, lengths, color="grey", linewidth=0.8, marker="_", markersize=14,
            label="one request of max_model_len")
    ax.set_xscale("log", base=2)
    ax.set_xticks(lengths, [f"{length:,}" for length in lengths])
    ax.set_xlim(min(lengths) / 1.6, max(lengths) * 1.6)
    ax.set_yscale("log")
    ax.set_xlabel("max_model_len", fontsize=8)
    ax.set_ylabel("KV pool tokens", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.legend(fontsize=7)
    return save_png(fig, path)


def throughput_plot(rows: list[schema.ThroughputRow] | None, path: str | Path) -> Path | None:
    """Output tokens/s and TTFT p50 against concurrency, one line per cell. None without a sweep."""
    rows = [r for r in rows or [] if r.output_tok_s]
    if not rows:
        return None
    fig, (speed, ttft) = _figure(8.5, 3.2, 2)
    for cell in dict.fromkeys(r.cell for r in rows):
        mine = sorted((r for r in rows if r.cell == cell), key=lambda r: r.concurrency)
        levels = [r.concurrency for r in mine]
        speed.plot(levels, [r.output_tok_s for r in mine], marker="o", label=cell)
        ttft.plot(levels, [r.ttft_ms_p50 for r in mine], marker="o", label=cell)
    levels = sorted({r.concurrency for r in rows})
    for ax, label in ((speed, "output tokens/s"), (ttft, "TTFT p50 (ms)")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(levels, [str(level) for level in levels])
        ax.set_xlabel("requests at once", fontsize=8)
        ax.set_ylabel(label, fontsize=8)
        ax.tick_params(labelsize=7)
    speed.legend(fontsize=7)
    return save_png(fig, path)
