"""Plain FP8 against its remedy: how much of the divergence the kept layers account for, and whether
the remedy cell itself is sound. Pure (scipy for the test).

A remedy cell (`fp8:keep=3,17`) differs from its plain cell (`fp8`) in one thing only: the named
layers keep the model dtype. Both are scored against the same `auto` baseline on the same token ids,
so their per-position KLs are paired. Two questions follow:

- **Attribution.** Does keeping the layers remove the divergence? The unit of the test is a block of
  `BLOCK_POSITIONS` consecutive positions of one sequence (neighbouring positions share context and
  are not independent; block means are the batch-means remedy for that). The one-sided Wilcoxon
  signed-rank test (Wilcoxon 1945; `scipy.stats.wilcoxon`) on the paired block means asks whether
  plain FP8 diverges more than the remedy. Under the null hypothesis that the kept layers do not
  matter the two cells are exchangeable block by block, so the test's p-value is valid.
- **Soundness.** A correct engine cannot make a cache that keeps more layers in the model dtype much
  worse than one that keeps none. A remedy significantly and substantially worse than plain FP8,
  overall or in one position range, is a defect of the engine path (or of kveval), not FP8 damage.
  So is a remedy whose per-position figures equal plain FP8's exactly: its setting never reached the
  engine.

The gate (`gate/attribution.py`, `gate/defects.py`) turns these figures into verdict reasons; nothing here decides.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
from scipy.stats import wilcoxon

from kveval.analysis.cell_records import BASELINE_KV, CellLike, stored_spec, typed_cells
from kveval.files.schema import CellResult
from kveval.analysis.divergence import compare_sequences, default_edges, scored_sequences

BLOCK_POSITIONS = 64
"""Positions per block: long enough that neighbouring blocks are close to independent, short enough
that a 1,000-token document gives a dozen blocks."""

MIN_BLOCK_POSITIONS = 16
"""A sequence's last, partial block counts only with at least this many positions."""

_FP8_ALIASES = {"fp8": "fp8_e4m3"}  # vLLM's `fp8` is e4m3 on every backend it supports


def _family(dtype: str) -> str:
    return _FP8_ALIASES.get(dtype, dtype)


def block_means(frame: pd.DataFrame, column: str = "kl") -> pd.Series:
    """Mean of `column` per (sequence, block of BLOCK_POSITIONS positions); short tail blocks dropped."""
    if frame.empty:
        return pd.Series(dtype=float)
    keyed = frame.assign(block=(frame["position"] // BLOCK_POSITIONS).astype(int))
    grouped = keyed.groupby(["sequence", "block"])[column]
    means, sizes = grouped.mean(), grouped.size()
    return means[sizes >= MIN_BLOCK_POSITIONS]


def one_sided_p(differences: np.ndarray) -> float:
    """One-sided Wilcoxon signed-rank p-value that the differences are centred above 0 (1.0 when every
    difference is 0 or there are none)."""
    nonzero = differences[differences != 0]
    if len(nonzero) == 0:
        return 1.0
    return float(wilcoxon(nonzero, alternative="greater").pvalue)


def _paired(plain: pd.DataFrame, remedy: pd.DataFrame) -> pd.DataFrame:
    keys = ["sequence", "position"]
    return plain[keys + ["kl"]].merge(remedy[keys + ["kl"]], on=keys, suffixes=("_plain", "_remedy")).dropna()


def pair_figures(plain: pd.DataFrame, remedy: pd.DataFrame) -> dict:
    """Paired figures of two position frames scored against the same baseline."""
    both = _paired(plain, remedy)
    out: dict = {"n_positions": int(len(both))}
    if both.empty:
        return {**out, "n_blocks": 0, "plain_kl_mean": None, "remedy_kl_mean": None, "reduction": None,
                "p_plain_worse": None, "p_remedy_worse": None, "identical": False, "buckets": []}
    plain_blocks = block_means(both.rename(columns={"kl_plain": "kl"}))
    remedy_blocks = block_means(both.rename(columns={"kl_remedy": "kl"}))
    block_differences = plain_blocks - remedy_blocks
    differences = block_differences.to_numpy(dtype=float)
    block_starts = np.array([block * BLOCK_POSITIONS for _, block in block_differences.index], dtype=int)
    plain_mean, remedy_mean = float(both["kl_plain"].mean()), float(both["kl_remedy"].mean())
    buckets = []
    edges = default_edges(int(both["position"].max()))
    for start, end in zip(edges, edges[1:]):
        inside = both[(both["position"] >= start) & (both["position"] < end)]
        if len(inside):
            in_bucket = differences[(block_starts >= start) & (block_starts < end)]
            buckets.append({"bucket": f"{start}-{end - 1}", "start": start, "n": int(len(inside)),
                            "n_blocks": int(len(in_bucket)),
                            "plain_kl_mean": float(inside["kl_plain"].mean()),
                            "remedy_kl_mean": float(inside["kl_remedy"].mean()),
                            "p_remedy_worse": one_sided_p(-in_bucket)})
    return {**out, "n_blocks": int(len(differences)), "plain_kl_mean": plain_mean, "remedy_kl_mean": remedy_mean,
            # Share of plain FP8's divergence that keeping the layers removes (negative: the remedy is worse).
            "reduction": (1.0 - remedy_mean / plain_mean) if plain_mean > 0 else None,
            "p_plain_worse": one_sided_p(differences), "p_remedy_worse": one_sided_p(-differences),
            "identical": bool(np.array_equal(both["kl_plain"].to_numpy(), both["kl_remedy"].to_numpy())),
            "buckets": buckets}


def _spec(facts: CellResult):
    return stored_spec(facts.kv_spec or "auto")


def remedy_pairs(cells: dict[str, CellLike], baseline_kv: str = BASELINE_KV) -> list[tuple[str, str, str]]:
    """(plain cell, remedy cell, baseline cell) at one max_model_len, all three scored. A remedy cell is
    any cell keeping layers; its plain cell has the same FP8 dtype (aliases included) and keeps none."""
    cells = typed_cells(cells)
    scored = {name: facts for name, facts in cells.items() if scored_sequences(facts)}
    specs = {name: _spec(facts) for name, facts in scored.items()}
    pairs = []
    for remedy, facts in sorted(scored.items()):
        spec = specs[remedy]
        if spec is None or not spec.keep:
            continue
        length = facts.max_model_len
        base = next((n for n, f in scored.items() if f.kv_spec == baseline_kv and f.max_model_len == length),
                    None)
        plain = next((n for n in sorted(scored) if scored[n].max_model_len == length and specs[n] is not None
                      and not specs[n].keep and _family(specs[n].dtype) == _family(spec.dtype)), None)
        if base and plain:
            pairs.append((plain, remedy, base))
    return pairs


def remedy_attribution(cells: dict[str, CellLike], baseline_kv: str = BASELINE_KV) -> list[dict]:
    """Per (plain, remedy) pair at one length: the paired figures (`pair_figures`) and the kept layers."""
    cells = typed_cells(cells)
    out = []
    for plain, remedy, base in remedy_pairs(cells, baseline_kv):
        reference = scored_sequences(cells[base])
        plain_frame, _, _ = compare_sequences(reference, scored_sequences(cells[plain]))
        remedy_frame, _, _ = compare_sequences(reference, scored_sequences(cells[remedy]))
        spec = _spec(cells[remedy])
        out.append({"plain": plain, "remedy": remedy, "reference": base, "kept": list(spec.keep),
                    "max_model_len": cells[remedy].max_model_len,
                    **pair_figures(plain_frame, remedy_frame)})
    return out


def identical_specs(cells: dict[str, CellLike], baseline_kv: str = BASELINE_KV) -> list[dict]:
    """Pairs of cells at one length whose KV specs differ in kept layers (same FP8 dtype) yet whose
    per-position KL against the same baseline is identical to the last digit: the difference between
    the two settings never reached the engine."""
    cells = typed_cells(cells)
    scored = {name: facts for name, facts in cells.items() if scored_sequences(facts) and _spec(facts) is not None
              and facts.kv_spec != baseline_kv}
    found = []
    names = sorted(scored)
    for i, first in enumerate(names):
        for second in names[i + 1:]:
            a, b = _spec(scored[first]), _spec(scored[second])
            length = scored[first].max_model_len
            if scored[second].max_model_len != length or _family(a.dtype) != _family(b.dtype) or a.keep == b.keep:
                continue
            base = next((n for n, f in cells.items() if f.kv_spec == baseline_kv
                         and f.max_model_len == length and scored_sequences(f)), None)
            if base is None:
                continue
            reference = scored_sequences(cells[base])
            frame_a, _, _ = compare_sequences(reference, scored_sequences(scored[first]))
            frame_b, _, _ = compare_sequences(reference, scored_sequences(scored[second]))
            both = _paired(frame_a, frame_b)
            if len(both) and np.array_equal(both["kl_plain"].to_numpy(), both["kl_remedy"].to_numpy()):
                found.append({"cells": [first, second], "max_model_len": length, "n_positions": int(len(both)),
                              "kl_mean": float(both["kl_plain"].mean())})
    return found
