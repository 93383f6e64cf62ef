"""Figures for the review, drawn from stored evidence rows (matplotlib, Agg backend: no display)."""
from __future__ import annotations

import io
import logging
import math
from pathlib import Path

from kveval.files import schema
from kveval.files.rundir import write_bytes_atomic

DPI = 90
# Every figure module imports this one. A font family the figures' text asks for that this machine lacks
# falls back to DejaVu Sans, and matplotlib logs each fallback as a warning: 21 "findfont" lines on a
# machine whose font cache lists only the system's fonts. The figures are fine; the user need not read that.
logging.getLogger("matplotlib.font_manager").setLevel(logging.ERROR)
COLOURS = 64  # PNG palette size: anti-aliased text on colour compresses badly in RGBA; 64 colours keeps it small


def _panels(frame, baseline_kv: str) -> list[list[str]]:
    """Cells per row: one row per max_model_len (ascending), the baseline cell first in each."""
    meta = frame.groupby("cell", sort=False)[["kv_spec", "max_model_len"]].first()
    rows = []
    for length in sorted(meta["max_model_len"].unique()):
        at = meta[meta["max_model_len"] == length]
        rows.append(sorted(at.index, key=lambda c: (at.loc[c, "kv_spec"] != baseline_kv,
                                                    str(at.loc[c, "kv_spec"]), c)))
    return rows


def _label(accuracy, n, rejected) -> str:
    if not n:
        return f"rej.\n{int(rejected)}" if rejected else "n 0"
    return f"{100 * accuracy:.0f}%\nn{int(n)}"


def _tokens(t: int) -> str:
    return f"{t / 1000:.3g}k" if t >= 1000 else str(t)


def save_png(fig, path: str | Path) -> Path:
    """Write the figure to `path` (atomically, as a palette PNG) and return the path."""
    path = Path(path)
    write_bytes_atomic(path, _png(fig))
    return path


def _png(fig) -> bytes:
    """The figure as a palette PNG (Pillow ships with matplotlib)."""
    from PIL import Image

    raw = io.BytesIO()
    fig.savefig(raw, format="png", metadata={"Software": None})
    raw.seek(0)
    image = Image.open(raw).convert("RGB").quantize(colors=COLOURS, method=Image.Quantize.MEDIANCUT)
    out = io.BytesIO()
    image.save(out, format="PNG", optimize=True)
    return out.getvalue()


def task_heatmap(grid_rows: list[schema.TaskGridRow], path: str | Path, baseline_kv: str = "auto") -> Path | None:
    """Accuracy per needle depth (y) × prompt length in tokens (x), one panel per cell: a row of
    panels per max_model_len with the baseline cell first. Each square shows the accuracy and n;
    a square whose samples were all rejected is grey. None (nothing written) when there is no row."""
    import pandas as pd

    frame = pd.DataFrame([schema.dump(row) for row in grid_rows or []])
    if frame.empty or not {"cell", "depth", "target_tokens"} <= set(frame.columns):
        return None
    frame = frame[frame["depth"].notna() & frame["target_tokens"].notna()]
    if frame.empty:
        return None

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.colors as mcolors
    from matplotlib.figure import Figure

    layout = _panels(frame, baseline_kv)
    n_rows, n_cols = len(layout), max(len(r) for r in layout)
    width = max(2.6, 0.5 * frame.groupby("cell")["target_tokens"].nunique().max() + 1.0)
    height = max(1.8, 0.36 * frame.groupby("cell")["depth"].nunique().max() + 1.1)
    fig = Figure(figsize=(width * n_cols + 0.9, height * n_rows), dpi=DPI, layout="constrained")
    axes = fig.subplots(n_rows, n_cols, squeeze=False)
    cmap = matplotlib.colormaps["RdYlGn"].resampled(10).with_extremes(bad="#d9d9d9")  # 10 % bands
    norm = mcolors.Normalize(0.0, 1.0)
    image = None
    for r, cells in enumerate(layout):
        for c in range(n_cols):
            ax = axes[r][c]
            if c >= len(cells):
                ax.set_axis_off()
                continue
            mine = frame[frame["cell"] == cells[c]]
            depths = sorted(mine["depth"].unique())
            lengths = sorted(int(t) for t in mine["target_tokens"].unique())
            values = [[math.nan] * len(lengths) for _ in depths]
            labels = [[""] * len(lengths) for _ in depths]
            for row in mine.itertuples():
                i, j = depths.index(row.depth), lengths.index(int(row.target_tokens))
                n = 0 if pd.isna(row.n) else row.n
                values[i][j] = row.accuracy if n and not pd.isna(row.accuracy) else math.nan
                labels[i][j] = _label(row.accuracy, n, 0 if pd.isna(row.rejected) else row.rejected)
            image = ax.imshow(values, cmap=cmap, norm=norm, aspect="auto", origin="upper")
            for i in range(len(depths)):
                for j in range(len(lengths)):
                    dark = not math.isnan(values[i][j]) and not 0.2 <= values[i][j] <= 0.8
                    ax.text(j, i, labels[i][j], ha="center", va="center", fontsize=6.5, linespacing=1.0,
                            color="white" if dark else "black")
            ax.set_xticks(range(len(lengths)), [_tokens(t) for t in lengths], fontsize=7)
            ax.set_yticks(range(len(depths)), [f"{d:g}" for d in depths], fontsize=7)
            ax.set_xlabel("prompt tokens", fontsize=8)
            ax.set_ylabel("needle depth", fontsize=8)
            ax.set_title(str(cells[c]), fontsize=9)
    if image is not None:
        bar = fig.colorbar(image, ax=axes, shrink=0.8)
        bar.set_label("accuracy", fontsize=8)
        bar.ax.tick_params(labelsize=7)
    return save_png(fig, path)
