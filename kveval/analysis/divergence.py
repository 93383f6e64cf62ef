"""Teacher-forced divergence: how far a cell's next-token distributions drift from the baseline's.

Both cells score the same token ids (prompt logprobs), so every position compares two
distributions over the same context. The figures follow llama.cpp's `--kl-divergence` report:
KL mean/median/percentiles/max, "same top" agreement with its standard error, and Δp of the actual
token. Only the top-k of each distribution is stored, so KL is approximated (see `position_kl`).
"""
from __future__ import annotations

import itertools
import math
from typing import Any, Iterable, Sequence

import numpy as np
import pandas as pd

from kveval.analysis.cell_records import BASELINE_KV
from kveval.analysis.cluster_interval import cluster_mean
from kveval.files import schema
from kveval.files.schema import CellResult, ScoredPosition, ScoredSequence

# Floor for a candidate probability before taking log(p/q): a token the candidate gives ~0 then
# costs p·ln(p/1e-10) ≈ 23·p nats instead of infinity.
PROB_FLOOR = 1e-10

# A position frame's columns (position_divergence); the code reads them as attributes (`frame.kl`). A pooled
# frame (compare_sequences) puts `sequence` and `sequence_kind` before them.
FRAME_COLUMNS = ["position", "token", "kl", "k", "missing", "top1_agree", "dp", "abs_dp"]
TopList = Sequence[Sequence[Any]]   # a position's top-k: [token, logprob] pairs, best first


def position_kl(reference_top: TopList, candidate_top: TopList) -> tuple[float, int, int]:
    """Approximate KL(P_ref || P_cand) at one position from top-k lists; returns (kl, k, missing).

    Support: the reference's k listed tokens plus one "rest" bucket holding everything else
    (1 − Σ listed mass) on both sides. Merging tokens into a bucket can only lower KL, so this is
    a lower bound on the full-vocabulary KL, apart from the estimate below.
    A reference token absent from the candidate's top-k gets the candidate's unlisted mass shared
    equally among the `missing` such tokens, capped at the candidate's smallest listed probability
    (it was not listed, so it cannot be more likely than anything that was).
    """
    if not reference_top:
        return math.nan, 0, 0
    p = [math.exp(lp) for _, lp in reference_top]
    cand = {tok: math.exp(lp) for tok, lp in candidate_top}
    found = [cand.get(tok) for tok, _ in reference_top]
    missing = sum(q is None for q in found)
    fill = 0.0
    if missing:
        leftover = max(0.0, 1.0 - sum(cand.values()))
        cap = min(cand.values()) if cand else 1.0
        fill = min(leftover / missing, cap)
    listed = [fill if q is None else q for q in found]
    # Plain Python: for k ≈ 20 numpy's per-call overhead dominates (about 5x slower here).
    p_rest = max(0.0, 1.0 - sum(p))  # rounding can push a listed sum a hair over 1
    q_rest = max(0.0, 1.0 - sum(listed))
    kl = sum(pi * math.log(pi / max(qi, PROB_FLOOR))  # 0·log 0 = 0
             for pi, qi in zip(p + [p_rest], listed + [q_rest]) if pi > 0)
    # After flooring, Q may sum slightly above 1 and KL dip a hair below 0; KL is never negative.
    return max(kl, 0.0), len(reference_top), missing


def _top1(top: TopList) -> Any:
    # Lists come best first; max() keeps the first of equal logprobs, so ties resolve the same way.
    return max(top, key=lambda pair: pair[1])[0] if top else None


def _position(position: ScoredPosition | dict[str, Any]) -> ScoredPosition:
    return position if isinstance(position, ScoredPosition) else ScoredPosition.model_validate(position)


def position_divergence(reference_positions: Sequence[ScoredPosition | dict[str, Any]],
                        candidate_positions: Sequence[ScoredPosition | dict[str, Any]], start: int = 0) -> pd.DataFrame:
    """One row per scored position, aligned by index; `start` is the absolute index of the first.

    Columns: position, token, kl (see `position_kl`), k (reference top-k size used), missing
    (reference top-k tokens absent from the candidate's top-k), top1_agree, dp = p_cand − p_ref of the
    actual token (from `logprob`), abs_dp = |dp|.
    """
    if len(reference_positions) != len(candidate_positions):
        raise ValueError(f"position counts differ: {len(reference_positions)} vs {len(candidate_positions)}")
    rows = []
    for offset, (ref, cand) in enumerate(zip(reference_positions, candidate_positions)):
        ref, cand = _position(ref), _position(cand)
        if ref.token != cand.token:
            raise ValueError(f"token differs at position {start + offset}: {ref.token} vs {cand.token}")
        ref_top, cand_top = ref.top or [], cand.top or []
        kl, k, missing = position_kl(ref_top, cand_top)
        dp = (math.exp(cand.logprob) - math.exp(ref.logprob)
              if ref.logprob is not None and cand.logprob is not None else math.nan)
        agree = (_top1(ref_top) == _top1(cand_top)) if ref_top and cand_top else None
        rows.append((start + offset, ref.token, kl, k, missing, agree, dp, abs(dp)))
    return pd.DataFrame(rows, columns=FRAME_COLUMNS)


def _num(value: float | np.floating[Any] | None) -> float | None:
    """Plain float for JSON; NaN/None -> None."""
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else float(value)


def divergence_summary(frame: pd.DataFrame) -> dict[str, Any]:
    """llama.cpp-style figures over a position frame (schema.DivergenceSummary); None where a figure is undefined."""
    kl = frame.kl.dropna().to_numpy(dtype=float) if len(frame) else np.array([])
    agree = frame.top1_agree.dropna().astype(bool).to_numpy() if len(frame) else np.array([])
    dp = frame.dp.dropna().to_numpy(dtype=float) if len(frame) else np.array([])
    out: dict[str, Any] = {"n": int(len(kl))}
    if len(kl):
        p50, p90, p99 = np.percentile(kl, [50, 90, 99])
        out.update(kl_mean=float(kl.mean()), kl_median=float(p50), kl_p90=float(p90), kl_p99=float(p99),
                   kl_max=float(kl.max()))
    else:
        out.update(kl_mean=None, kl_median=None, kl_p90=None, kl_p99=None, kl_max=None)
    n_agree = len(agree)
    share = float(agree.mean()) if n_agree else None
    # Same standard error as llama.cpp's "same top p": sqrt(p(1-p)/(n-1)).
    se = math.sqrt(share * (1 - share) / (n_agree - 1)) if share is not None and n_agree > 1 else None
    out.update(top1_n=int(n_agree), top1_agreement=share, top1_agreement_se=se)
    if len(dp):
        absdp = np.abs(dp)
        out.update(dp_mean=float(dp.mean()), abs_dp_mean=float(absdp.mean()),
                   abs_dp_p99=float(np.percentile(absdp, 99)), abs_dp_max=float(absdp.max()),
                   dp_rms=float(np.sqrt(np.mean(dp ** 2))))
    else:
        out.update(dp_mean=None, abs_dp_mean=None, abs_dp_p99=None, abs_dp_max=None, dp_rms=None)
    return out


def default_edges(max_position: int) -> list[int]:
    """0, 128, 256, … doubling until the last edge lies beyond `max_position`."""
    edges = [0, 128]
    while edges[-1] <= max_position:
        edges.append(edges[-1] * 2)
    return edges


def by_position_bucket(frame: pd.DataFrame, edges: list[int] | None = None) -> pd.DataFrame:
    """Summary per absolute-position bucket [start, end); empty buckets are left out.

    Positions at or beyond the last given edge fall in an open bucket (end None).
    """
    columns = ["bucket", "start", "end"] + list(divergence_summary(frame.iloc[:0]).keys())
    if frame.empty:
        return pd.DataFrame(columns=columns)
    edges = sorted(edges) if edges else default_edges(int(frame.position.max()))
    bounds: list[tuple[int, int | None]] = list(zip(edges, [*edges[1:], None]))
    rows, ends = [], []
    for start, end in bounds:
        inside = frame[(frame.position >= start) & ((frame.position < end) if end is not None else True)]
        if inside.empty:
            continue
        label = f"{start}-{end - 1}" if end is not None else f"{start}+"
        rows.append({"bucket": label, "start": start, "end": end, **divergence_summary(inside)})
        ends.append(end)
    return pd.DataFrame(rows, columns=columns).assign(end=pd.Series(ends, dtype=object))  # keep ints; None = open


# --- across cells -------------------------------------------------------------------------------

def _scored(facts: CellResult, noise: bool = False) -> dict[str, ScoredSequence]:
    """Accepted, scored sequences of a cell by id ({} when it did not start or has no scoring)."""
    phase = facts.phases.scoring
    if not facts.started or phase is None:
        return {}
    sequences = (phase.noise.sequences if phase.noise else []) if noise else (phase.sequences or [])
    return {s.id: s for s in sequences if s.accepted and s.positions}


def scored_sequences(facts: CellResult) -> dict[str, ScoredSequence]:
    """A cell's accepted, scored sequences by id ({} when it did not start or has no scoring)."""
    return _scored(facts)


def _align(ref: ScoredSequence, cand: ScoredSequence) -> tuple[list[ScoredPosition], list[ScoredPosition], int]:
    """Both sequences' positions from the later scored_from on, cut to the shorter."""
    start = max(ref.scored_from, cand.scored_from)
    a = (ref.positions or [])[start - ref.scored_from:]
    b = (cand.positions or [])[start - cand.scored_from:]
    n = min(len(a), len(b))
    return a[:n], b[:n], start


def _records(table: pd.DataFrame) -> list[dict[str, Any]]:
    return [{key: (_num(value) if isinstance(value, (float, np.floating)) else
                   int(value) if isinstance(value, (np.integer,)) else value)
             for key, value in row.items()} for row in table.to_dict("records")]


# Position frames by the pair of sequence objects they were computed from (the objects are held, so an
# id is never another object's): the parent judges the same unchanged cells at every look (RunDir keeps
# their typed records), and the per-position KL was the larger part of a look (issue 18).
_FRAMES: dict[tuple[int, int], tuple[ScoredSequence, ScoredSequence, tuple[pd.DataFrame, int]]] = {}
_MAX_FRAMES = 512


def _sequence_frame(ref: ScoredSequence, cand: ScoredSequence) -> tuple[pd.DataFrame, int]:
    """position_divergence of the two sequences' aligned positions, and the index of the first."""
    key = (id(ref), id(cand))
    cached = _FRAMES.get(key)
    if cached is not None and cached[0] is ref and cached[1] is cand:
        frame, start = cached[2]
        return frame.copy(), start
    a, b, start = _align(ref, cand)
    frame = position_divergence(a, b, start=start)
    if len(_FRAMES) >= _MAX_FRAMES:
        _FRAMES.clear()
    _FRAMES[key] = (ref, cand, (frame, start))
    return frame.copy(), start


def compare_sequences(reference: dict[str, ScoredSequence],
                      candidate: dict[str, ScoredSequence]) -> tuple[pd.DataFrame, list[dict[str, Any]],
                                                                     list[dict[str, Any]]]:
    """Pooled position frame, per-sequence summaries and skipped sequences for two scored cells."""
    frames, per_sequence, skipped = [], [], []
    for seq_id in sorted(set(reference) & set(candidate)):
        ref, cand = reference[seq_id], candidate[seq_id]
        if ref.token_ids != cand.token_ids:
            skipped.append({"id": seq_id, "reason": "token ids differ between the cells"})
            continue
        frame, start = _sequence_frame(ref, cand)
        if frame.empty:
            continue
        frame.insert(0, "sequence", seq_id)
        frame.insert(1, "sequence_kind", ref.kind)
        frames.append(frame)
        per_sequence.append({"id": seq_id, "kind": ref.kind, "scored_from": start, **divergence_summary(frame)})
    pooled = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=["sequence", "sequence_kind"] + FRAME_COLUMNS)
    return pooled, per_sequence, skipped


LATE_FRACTION = 0.5
"""Late positions: from this share of a cell's usable context (min(max_model_len, the model's own
limit)) on. Their KL is judged on its own, so damage that grows with position is not diluted by the
many short positions every document starts with."""


def late_start(max_model_len: int | None, model_limit: int | None = None) -> int | None:
    usable = min(x for x in (max_model_len, model_limit) if x) if (max_model_len or model_limit) else None
    return int(LATE_FRACTION * usable) if usable else None


def _per_sequence(values: pd.DataFrame, column: str) -> tuple[pd.Series, pd.Series]:
    """Each sequence's sum of `column` over the rows of `values`, and its number of rows."""
    by_sequence = values.groupby("sequence")
    return by_sequence[column].sum().astype(float), by_sequence.size()


def clustered_figures(pooled: pd.DataFrame, late_from: int | None) -> dict[str, dict[str, Any]]:
    """KL mean, late KL mean and top-1 agreement as means over the scored sequences (the unit of the
    gate's intervals: analysis/cluster_interval.py), each {estimate, se, clusters, positions}."""
    if pooled.empty:
        return {}
    kl = pooled[pooled.kl.notna()]
    parts = {"kl_mean": _per_sequence(kl, "kl"),
             "top1_agreement": _per_sequence(pooled[pooled.top1_agree.notna()], "top1_agree"),
             **({"kl_late_mean": _per_sequence(kl[kl.position >= late_from], "kl")} if late_from is not None else {})}
    out = {}
    for name, (sums, counts) in parts.items():
        figure = cluster_mean(sums.to_numpy(), counts.reindex(sums.index).to_numpy())
        if figure is not None:
            out[name] = schema.dump(schema.ClusterFigure(estimate=figure.estimate, se=figure.se,
                                                         clusters=figure.clusters, positions=figure.positions))
    return out


def _comparison(kind: str, cell: str, reference: str, ref_seqs: dict[str, ScoredSequence],
                cand_seqs: dict[str, ScoredSequence], late_from: int | None = None, **extra: Any) -> dict[str, Any]:
    """One comparison of the evidence (schema.Comparison): `cell`'s scored sequences against `reference`'s."""
    pooled, per_sequence, skipped = compare_sequences(ref_seqs, cand_seqs)
    by_kind = {k: divergence_summary(group) for k, group in pooled.groupby("sequence_kind", sort=True)} if len(pooled) else {}
    out = {"cell": cell, "reference": reference, "kind": kind, **extra,
           "summary": divergence_summary(pooled), "buckets": _records(by_position_bucket(pooled)),
           "max_position": int(pooled.position.max()) if len(pooled) else None,
           "by_sequence_kind": by_kind, "per_sequence": per_sequence, "skipped": skipped}
    if late_from is not None:
        late = pooled[pooled.position >= late_from] if len(pooled) else pooled
        out = {**out, "late": {"start": late_from, **divergence_summary(late)}}
    if kind == "kv":
        compared = dict.fromkeys(pooled.sequence)   # the sequences with scored positions, in per_sequence's order
        looks = sequence_looks([cand_seqs[seq_id].round or 0 for seq_id in compared])
        out = {**out, "clustered": clustered_figures(pooled, late_from), **({"looks": looks} if len(looks) > 1 else {})}
    return out


def sequence_looks(rounds: list[int]) -> list[int]:
    """Sequences compared at each look (cumulative), from the round each compared sequence was scored in."""
    return [sum(1 for r in rounds if r <= number) for number in sorted(set(rounds))]


def _nearest_baseline(facts: CellResult, bases: dict[str, CellResult]) -> str | None:
    """Same-length baseline if any, else the nearest length (ties -> the longer one)."""
    length = facts.max_model_len
    ranked = sorted(bases, key=lambda name: (abs(bases[name].max_model_len - length), -bases[name].max_model_len))
    return ranked[0] if ranked else None


def cell_divergence(cells: dict[str, CellResult], baseline_kv: str = BASELINE_KV,
                    model_limit: int | None = None) -> dict[str, Any]:
    """Every non-baseline cell against its baseline, plus the baseline's own noise floor.

    kind "kv": cell vs the started, scored baseline at the same max_model_len. When that baseline
    is missing (typically: it could not start at a length only the smaller cache reaches) the
    nearest-length baseline is used instead on the sequences both scored, marked same_length False;
    the "noise_length" comparisons measure what a length change alone does.
    kind "noise_length": baseline vs baseline at another max_model_len (every pair, shorter as reference).
    kind "noise_batch": a baseline cell's `noise` re-scoring (other batch composition) vs its main scoring.
    noise_floor takes the max of each figure over the noise comparisons (None when there are none).
    kv comparisons also carry `late`: the summary over positions from `late_start` of the cell on.
    """
    order = sorted(cells, key=lambda name: (cells[name].max_model_len, cells[name].kv_spec, name))
    bases = {n: cells[n] for n in order if cells[n].kv_spec == baseline_kv and _scored(cells[n])}
    comparisons, unmatched = [], []
    for name in order:
        facts = cells[name]
        if facts.kv_spec == baseline_kv:
            continue
        if not facts.started:
            unmatched.append({"cell": name, "reason": "did not start"})
            continue
        if not _scored(facts):
            unmatched.append({"cell": name, "reason": "no scored sequences"})
            continue
        ref = _nearest_baseline(facts, bases)
        if ref is None:
            unmatched.append({"cell": name, "reason": f"no started, scored {baseline_kv} cell to compare with"})
            continue
        same = cells[ref].max_model_len == facts.max_model_len
        scoring = facts.phases.scoring
        design = scoring.design if scoring else None
        comparisons.append(_comparison("kv", name, ref, _scored(cells[ref]), _scored(facts), same_length=same,
                                       late_from=late_start(facts.max_model_len, model_limit),
                                       kv_spec=facts.kv_spec, max_model_len=facts.max_model_len,
                                       **({"design": design.model_dump()} if design else {})))
    for shorter, longer in itertools.combinations(bases, 2):
        if cells[shorter].max_model_len != cells[longer].max_model_len:
            comparisons.append(_comparison("noise_length", longer, shorter, _scored(cells[shorter]), _scored(cells[longer])))
    for name in bases:
        again = _scored(cells[name], noise=True)
        if again:
            comparisons.append(_comparison("noise_batch", name, name, _scored(cells[name]), again))
    return {"baseline_kv": baseline_kv, "comparisons": comparisons, "unmatched": unmatched,
            "noise_floor": noise_floor(comparisons)}


def _worst(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return max(present) if present else None


def noise_floor(comparisons: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Worst (max) KL mean, KL p99 and top-1 disagreement over noise comparisons (`_comparison`) with data."""
    typed = [schema.Comparison.model_validate(comparison) for comparison in comparisons]
    noise = [c for c in typed if c.kind.startswith("noise") and c.summary.n]
    if not noise:
        return None
    return {
        "kl_mean": _worst(c.summary.kl_mean for c in noise),
        "kl_p99": _worst(c.summary.kl_p99 for c in noise),
        "top1_disagreement": _worst(None if c.summary.top1_agreement is None else 1.0 - c.summary.top1_agreement
                                    for c in noise),
        "source": [{"kind": c.kind, "cell": c.cell, "reference": c.reference, "n": c.summary.n} for c in noise],
    }
