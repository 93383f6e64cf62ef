"""How far the same `auto` cell moves between two platforms (issue 39): the difference a baseline made on
another machine (`--baseline-from`) carries into every comparison against it. Two runs of one model with
the same inputs (the comparability `--baseline-from` checks), each with an `auto` cell at the same length:
- teacher-forced scoring on the sequences both scored with the same token ids (the scoring documents
  always; a continuation only where both platforms generated the same greedy tokens): KL of the second
  platform's next-token distribution from the first's, and top-1 agreement, as means over sequences
  with their standard errors (analysis/cluster_interval.py, the gate's unit);
- greedy generation: the share of prompts whose outputs are token for token the same.
Pure: the caller loads the cells (scripts/platform_difference.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from pydantic import BaseModel

from kveval.analysis.divergence import clustered_figures, compare_sequences, scored_sequences
from kveval.files.schema import CellResult


@dataclass(frozen=True)
class Figure:
    estimate: float
    se: float
    sequences: int
    positions: int


@dataclass(frozen=True)
class PlatformDifference:
    kl_mean: Optional[Figure]
    top1_agreement: Optional[Figure]
    compared_sequences: int
    skipped_sequences: int         # scored by both with other token ids (their continuations differ)
    same_outputs: int              # greedy outputs token for token the same, of
    compared_outputs: int          # prompts both accepted


class _Clustered(BaseModel):
    """One of divergence.clustered_figures' figures, as that function builds it."""

    estimate: float
    se: float
    clusters: int
    positions: int


def _figure(figures: dict[str, dict[str, Any]], name: str) -> Optional[Figure]:
    found = figures.get(name)
    if not found:
        return None
    figure = _Clustered.model_validate(found)
    return Figure(figure.estimate, figure.se, figure.clusters, figure.positions)


def platform_difference(first: CellResult, second: CellResult) -> PlatformDifference:
    """`second` against `first` (the baseline's platform first), on what both measured alike."""
    pooled, per_sequence, skipped = compare_sequences(scored_sequences(first), scored_sequences(second))
    figures = clustered_figures(pooled, None)
    outputs_first = {r.prompt_id: r for r in (first.phases.generation.records or [])} \
        if first.phases.generation is not None else {}
    outputs_second = {r.prompt_id: r for r in (second.phases.generation.records or [])} \
        if second.phases.generation is not None else {}
    both = [(outputs_first[p], outputs_second[p]) for p in sorted(set(outputs_first) & set(outputs_second))
            if outputs_first[p].accepted and outputs_second[p].accepted]
    same = sum(1 for a, b in both if a.token_ids == b.token_ids)
    return PlatformDifference(_figure(figures, "kl_mean"), _figure(figures, "top1_agreement"), len(per_sequence),
                              len(skipped), same, len(both))
