"""Plain FP8 against its remedy: how much of the divergence the kept layers account for, and whether
the remedy cell itself is sound. Pure (scipy for the test).

A remedy cell (`fp8:keep=3,17`) differs from its plain cell (`fp8`) in one thing only: the named
layers keep the model dtype. Both are scored against the same `auto` baseline on the same token ids,
so their per-position KLs are paired. Two questions follow:

- **Attribution.** Does keeping the layers remove the divergence? The unit of the test is the scored
  sequence (a document `doc:N`, or a prompt's continuation `cont:...`): positions of one sequence
  share its context and its fate, so neither positions nor blocks of positions are independent (a
  Wilcoxon test on 64-position blocks rejected a true null in 13-43 % of simulated runs at a nominal
  5 %). Per sequence g, d_g = mean KL(plain) - mean KL(remedy) over its paired positions, weighted by
  its number of paired positions w_g; the statistic is sum(w_g d_g) / sum(w_g), which is exactly the
  difference of the pooled KL means the review shows. Under the null hypothesis that the kept layers
  do not matter, plain and remedy are exchangeable within each sequence, so every sign pattern of
  the d_g is equally likely: the sign-flip permutation test over sequences (Fisher 1935; Good 2005,
  *Permutation, Parametric and Bootstrap Tests of Hypotheses*, ch. 3; `scipy.stats.permutation_test`
  with `permutation_type='samples'`) is exact, whatever the dependence inside a sequence, because it
  permutes whole clusters and keeps their inside as it is. It is enumerated exactly for up to 16
  sequences (2^16 sign patterns) and drawn at random beyond, with a fixed seed. Its smallest
  attainable p-value is 2^-G for G sequences: with few sequences nothing can be significant, and the
  figures say so (`min_p`).
- **Soundness.** A correct engine cannot make a cache that keeps more layers in the model dtype much
  worse than one that keeps none. A remedy significantly and substantially worse than plain FP8,
  overall or in one position range, is a defect of the engine path (or of kveval), not FP8 damage
  (the same test by sequence, the other direction). So is a remedy whose per-position figures equal
  plain FP8's exactly: its setting never reached the engine.

The gate (`gate/attribution.py`, `gate/defects.py`) turns these figures into verdict reasons; nothing here decides.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any, cast

import numpy as np
import pandas as pd
from scipy.stats import permutation_test

from kveval.analysis.cell_records import BASELINE_KV, stored_spec
from kveval.files.schema import CellResult
from kveval.inputs.kvspec import KVSpec
from kveval.analysis.divergence import compare_sequences, default_edges, scored_sequences

N_RESAMPLES = 2 ** 16
"""Sign patterns of the test: every one of them (exact) for up to 16 sequences, this many random
ones beyond (p then no smaller than 1 / (N_RESAMPLES + 1))."""

RANDOM_STATE = 0
"""Seed of the random sign patterns beyond 16 sequences: the same evidence gives the same p."""

_BATCH = 4096  # sign patterns evaluated at once: bounds memory with hundreds of sequences

_FP8_ALIASES = {"fp8": "fp8_e4m3"}  # vLLM's `fp8` is e4m3 on every backend it supports


def _family(dtype: str) -> str:
    return _FP8_ALIASES.get(dtype, dtype)


def sequence_differences(both: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Per sequence of a paired frame (`kl_plain`, `kl_remedy`): d_g = mean KL(plain) - mean KL(remedy)
    over its paired positions, and its weight w_g = the number of those positions."""
    if both.empty:
        return np.zeros(0), np.zeros(0)
    codes, _ = pd.factorize(both["sequence"], sort=True)
    weights = np.bincount(codes).astype(float)
    gaps = both["kl_plain"].to_numpy(dtype=float) - both["kl_remedy"].to_numpy(dtype=float)
    return np.bincount(codes, gaps) / weights, weights


def min_attainable_p(n_sequences: int) -> float:
    """The smallest p-value the sign-flip test can give with this many sequences (differing from 0)."""
    if n_sequences <= 0:
        return 1.0
    return 2.0 ** -n_sequences if 2 ** n_sequences <= N_RESAMPLES else 1.0 / (N_RESAMPLES + 1)


def _weighted_sum(x: np.ndarray, axis: int = -1) -> np.ndarray:
    return cast(np.ndarray, np.sum(x, axis=axis))


@lru_cache(maxsize=None)
def _sign_patterns(n: int) -> np.ndarray:
    """All 2^n sign patterns of n sequences, one a row."""
    bits = (np.arange(2 ** n)[:, None] >> np.arange(n)) & 1
    patterns: np.ndarray = 1.0 - 2.0 * bits
    return patterns


def _sign_flip(x: np.ndarray) -> tuple[float, float]:
    """(p that sum(x) is above 0, p that it is below 0) by sign flips of the x_g, none of them 0: every
    pattern for up to 16 (the exact test, as `scipy.stats.permutation_test` enumerates it, here once for
    both directions), N_RESAMPLES random ones beyond (scipy, fixed seed). Null values within scipy's
    relative tolerance of the observed one count as equal to it."""
    if len(x) == 1:   # two sign patterns, the observed one and its flip (scipy asks for two or more)
        return (0.5, 1.0) if x[0] > 0 else (1.0, 0.5)
    if 2 ** len(x) <= N_RESAMPLES:
        null, observed = _sign_patterns(len(x)) @ x, float(np.sum(x))
        gamma = abs(observed) * np.finfo(float).eps * 100
        return float(np.mean(null >= observed - gamma)), float(np.mean(null <= observed + gamma))
    above, below = (float(min(1.0, permutation_test((x,), _weighted_sum, permutation_type="samples", vectorized=True,
                                                    n_resamples=N_RESAMPLES, alternative=alternative, batch=_BATCH,
                                                    rng=np.random.default_rng(RANDOM_STATE)).pvalue))
                    for alternative in ("greater", "less"))
    return above, below


def sign_flip_test(differences: np.ndarray, weights: np.ndarray) -> tuple[float, float]:
    """One-sided p-values of the sign-flip permutation test over sequences that the weighted mean
    difference sum(w d) / sum(w) is above 0 and that it is below 0; (1.0, 1.0) when every difference is 0.

    The sign of each sequence's difference flips as a whole; the weights stay with their sequences.
    Since sum(w) is the same under every flip, the test of sum(w d) / sum(w) is the test of sum(w d):
    it runs on x_g = w_g d_g, one sample, which `permutation_type='samples'` sign-flips. Sequences with
    x_g = 0 are left out: flipping them changes no statistic, so the p-values are the same without them."""
    x = np.asarray(weights, dtype=float) * np.asarray(differences, dtype=float)
    x = x[x != 0]
    return (1.0, 1.0) if len(x) == 0 else _sign_flip(x)


def sign_flip_p(differences: np.ndarray, weights: np.ndarray, alternative: str = "greater") -> float:
    """`sign_flip_test`'s p-value in one direction: `greater` (plain FP8 worse) or `less` (the remedy worse)."""
    greater, less = sign_flip_test(differences, weights)
    return greater if alternative == "greater" else less


def _paired(plain: pd.DataFrame, remedy: pd.DataFrame) -> pd.DataFrame:
    keys = ["sequence", "position"]
    return plain[keys + ["kl"]].merge(remedy[keys + ["kl"]], on=keys, suffixes=("_plain", "_remedy")).dropna()


def pair_figures(plain: pd.DataFrame, remedy: pd.DataFrame) -> dict[str, Any]:
    """Paired figures of two position frames scored against the same baseline: the KL means over the
    paired positions, and the sign-flip tests by sequence, overall and per position range."""
    both = _paired(plain, remedy)
    out: dict[str, Any] = {"n_positions": int(len(both))}
    if both.empty:
        return {**out, "n_sequences": 0, "min_p": None, "plain_kl_mean": None, "remedy_kl_mean": None,
                "reduction": None, "p_plain_worse": None, "p_remedy_worse": None, "identical": False,
                "buckets": []}
    differences, weights = sequence_differences(both)
    p_plain_worse, p_remedy_worse = sign_flip_test(differences, weights)
    plain_mean, remedy_mean = float(both["kl_plain"].mean()), float(both["kl_remedy"].mean())
    buckets = []
    edges = default_edges(int(both["position"].max()))
    for start, end in zip(edges, edges[1:]):
        inside = both[(both["position"] >= start) & (both["position"] < end)]
        if len(inside):
            in_differences, in_weights = sequence_differences(inside)
            buckets.append({"bucket": f"{start}-{end - 1}", "start": start, "n": int(len(inside)),
                            "n_sequences": int(len(in_differences)),
                            "plain_kl_mean": float(inside["kl_plain"].mean()),
                            "remedy_kl_mean": float(inside["kl_remedy"].mean()),
                            "p_remedy_worse": sign_flip_p(in_differences, in_weights, "less")})
    return {**out, "n_sequences": int(len(differences)),
            "min_p": min_attainable_p(int(np.count_nonzero(weights * differences))),
            "plain_kl_mean": plain_mean, "remedy_kl_mean": remedy_mean,
            # Share of plain FP8's divergence that keeping the layers removes (negative: the remedy is worse).
            "reduction": (1.0 - remedy_mean / plain_mean) if plain_mean > 0 else None,
            "p_plain_worse": p_plain_worse, "p_remedy_worse": p_remedy_worse,
            "identical": bool(np.array_equal(both["kl_plain"].to_numpy(), both["kl_remedy"].to_numpy())),
            "buckets": buckets}


def _spec(facts: CellResult) -> KVSpec | None:
    return stored_spec(facts.kv_spec or "auto")


def remedy_pairs(cells: dict[str, CellResult], baseline_kv: str = BASELINE_KV) -> list[tuple[str, str, str]]:
    """(plain cell, remedy cell, baseline cell) at one max_model_len, all three scored. A remedy cell is
    any cell keeping layers; its plain cell has the same FP8 dtype (aliases included) and keeps none."""
    scored = {name: facts for name, facts in cells.items() if scored_sequences(facts)}
    specs = {name: spec for name, facts in scored.items() if (spec := _spec(facts)) is not None}
    pairs = []
    for remedy, facts in sorted(scored.items()):
        spec = specs.get(remedy)
        if spec is None or not spec.keep:
            continue
        length = facts.max_model_len
        base = next((n for n, f in scored.items() if f.kv_spec == baseline_kv and f.max_model_len == length),
                    None)
        plain = next((n for n in sorted(scored) if scored[n].max_model_len == length and n in specs
                      and not specs[n].keep and _family(specs[n].dtype) == _family(spec.dtype)), None)
        if base and plain:
            pairs.append((plain, remedy, base))
    return pairs


def remedy_attribution(cells: dict[str, CellResult], baseline_kv: str = BASELINE_KV) -> list[dict[str, Any]]:
    """Per (plain, remedy) pair at one length: the paired figures (`pair_figures`) and the kept layers."""
    out = []
    for plain, remedy, base in remedy_pairs(cells, baseline_kv):
        reference = scored_sequences(cells[base])
        plain_frame, _, _ = compare_sequences(reference, scored_sequences(cells[plain]))
        remedy_frame, _, _ = compare_sequences(reference, scored_sequences(cells[remedy]))
        spec = _spec(cells[remedy])   # a remedy cell's spec reads (remedy_pairs)
        out.append({"plain": plain, "remedy": remedy, "reference": base, "kept": list(spec.keep) if spec else [],
                    "max_model_len": cells[remedy].max_model_len,
                    **pair_figures(plain_frame, remedy_frame)})
    return out


def identical_specs(cells: dict[str, CellResult], baseline_kv: str = BASELINE_KV) -> list[dict[str, Any]]:
    """Pairs of cells at one length whose KV specs differ in kept layers (same FP8 dtype) yet whose
    per-position KL against the same baseline is identical to the last digit: the difference between
    the two settings never reached the engine."""
    specs = {name: spec for name, facts in cells.items() if scored_sequences(facts)
             and (spec := _spec(facts)) is not None and facts.kv_spec != baseline_kv}
    scored = {name: cells[name] for name in specs}
    found = []
    names = sorted(scored)
    for i, first in enumerate(names):
        for second in names[i + 1:]:
            a, b = specs[first], specs[second]
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
