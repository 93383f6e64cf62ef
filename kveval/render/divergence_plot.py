"""KL and top-1 agreement by token-position bucket, one line per KV comparison (matplotlib, Agg).

Where a KV cache's error grows with context, it shows here first: late buckets drift up while
the early ones stay at the noise floor. Noise comparisons (`auto` vs itself) are drawn grey.
"""
from __future__ import annotations

from pathlib import Path

from kveval.files import schema
from kveval.render.plots import DPI, save_png

NOISE_KINDS = ("noise_batch", "noise_length")


def kl_position_plot(divergence: schema.Divergence | None, path: str | Path) -> Path | None:
    """Mean KL (solid) and p99 (dotted), and top-1 agreement, per position bucket.
    None when no KV comparison has position buckets (a noise-only run has nothing to show)."""
    comparisons = [c for c in (divergence.comparisons if divergence else []) if c.buckets]
    if not any(c.kind not in NOISE_KINDS for c in comparisons):
        return None
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8.5, 3.2), dpi=DPI, layout="constrained")
    kl_ax, top1_ax = fig.subplots(1, 2)
    # Buckets are the same edges in every comparison: one categorical x axis, ordered by position.
    labels = sorted({b.bucket: b.start for c in comparisons for b in c.buckets}.items(), key=lambda kv: kv[1])
    where = {label: i for i, (label, _) in enumerate(labels)}
    noise_labelled = False
    for comp in comparisons:
        noise = comp.kind in NOISE_KINDS
        buckets = [b for b in comp.buckets if b.n]
        x = [where[b.bucket] for b in buckets]
        if noise:
            style = {"color": "grey", "alpha": 0.6, "linewidth": 0.8,
                     "label": None if noise_labelled else f"noise ({comp.reference.split('-')[0]} vs itself)"}
            noise_labelled = True
        else:
            style = {"label": f"{comp.cell} vs {comp.reference}"}
        # A log axis cannot show KL 0 (identical distributions): those points are left out.
        mean = [(i, b.kl_mean) for i, b in zip(x, buckets) if b.kl_mean]
        line, = kl_ax.plot(*zip(*mean), marker="o", markersize=3, **style) if mean else kl_ax.plot([], [], **style)
        if not noise:
            p99 = [(i, b.kl_p99) for i, b in zip(x, buckets) if b.kl_p99]
            if p99:
                kl_ax.plot(*zip(*p99), linestyle=":", color=line.get_color())
        top1_ax.plot(x, [b.top1_agreement for b in buckets], marker="o", markersize=3,
                     **{k: v for k, v in style.items() if k != "label"}, **({} if noise else {"color": line.get_color()}))
    kl_ax.set_yscale("log")
    kl_ax.set_ylabel("KL nats: mean (solid), p99 (dotted)", fontsize=8)
    top1_ax.set_ylabel("top-1 agreement", fontsize=8)
    for ax in (kl_ax, top1_ax):
        ax.set_xticks(range(len(labels)), [label for label, _ in labels], rotation=30)
        ax.set_xlabel("token positions", fontsize=8)
        ax.tick_params(labelsize=7)
    kl_ax.legend(fontsize=6)
    return save_png(fig, path)
