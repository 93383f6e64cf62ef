"""Output diff: how far, and how, a cell's greedy outputs differ from a reference cell's.

Two comparisons are made, so FP8 drift can be read against a noise floor:
  "kv"     every non-baseline cell vs the baseline (auto) cell at the same max_model_len;
  "length" every baseline cell vs a baseline cell at a smaller max_model_len (same KV dtype, so any
           difference there is numerical noise from a different engine shape, not the KV dtype).
Pure: only stored records are read; no tokenizer is needed.
"""
from __future__ import annotations

import os
from typing import Any

import pandas as pd
from rapidfuzz import fuzz

from kveval.analysis.cell_records import BASELINE_KV, Prompt, baseline_for, generation_records, prompts_of
from kveval.files.schema import CellResult, GenerationRecord

EXCERPT_BEFORE = 60   # characters of shared text shown before the divergence
EXCERPT_AFTER = 80    # characters shown from each side after it

PAIR_COLUMNS = ["workload", "prompt", "cell", "reference", "comparison", "identical", "first_divergent_token",
                "similarity", "length_ratio", "tokens", "reference_tokens", "excerpt", "prefix_only"]
SUMMARY_COLUMNS = ["workload", "cell", "reference", "comparison", "identical", "compared", "exact_match_rate",
                   "median_similarity", "median_length_ratio", "earliest_divergence", "prefix_only"]
EXAMPLE_COLUMNS = ["workload", "cell", "reference", "comparison", "prompt", "first_divergent_token", "similarity",
                   "excerpt"]


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """Index of the first differing token; None when identical (length included)."""
    for index, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return index
    return None if len(a) == len(b) else min(len(a), len(b))


def _tokens(record: GenerationRecord) -> list[int]:
    return record.token_ids or []


def divergence_excerpt(candidate_text: str, reference_text: str,
                       before: int = EXCERPT_BEFORE, after: int = EXCERPT_AFTER) -> dict[str, Any]:
    """Text around the first differing character.

    Token positions cannot be mapped to characters without the tokenizer, so the divergence is
    placed at the end of the common character prefix; it is where a reader sees the texts part.
    """
    offset = len(os.path.commonprefix([candidate_text, reference_text]))
    return {"before": candidate_text[max(0, offset - before):offset],
            "candidate": candidate_text[offset:offset + after],
            "reference": reference_text[offset:offset + after],
            "char_offset": offset}


def compare_outputs(candidate: GenerationRecord, reference: GenerationRecord) -> dict[str, Any]:
    """Token identity, first divergent token, text similarity, length ratio and an excerpt."""
    mine, theirs = _tokens(candidate), _tokens(reference)
    text, reference_text = candidate.text or "", reference.text or ""
    index = first_divergence(mine, theirs)
    return {"identical": index is None,
            "first_divergent_token": index,
            "similarity": fuzz.ratio(text, reference_text) / 100.0,   # 1.0 for two empty texts
            "length_ratio": len(mine) / len(theirs) if theirs else None,
            "tokens": len(mine),
            "reference_tokens": len(theirs),
            "excerpt": None if index is None else divergence_excerpt(text, reference_text)}


def _accepted(record: GenerationRecord | None) -> bool:
    return bool(record and record.accepted)


def _name_of(cells: dict[str, CellResult], facts: CellResult) -> str:
    for name, other in cells.items():
        if other is facts:
            return name
    return facts.cell


def _kv_references(cells: dict[str, CellResult], baseline_kv: str) -> list[tuple[str, str]]:
    """(cell, reference) for every started non-baseline cell whose baseline also started."""
    pairs = []
    for name, facts in cells.items():
        base = baseline_for(cells, facts, baseline_kv)
        if base is not None and facts.started and base.started:
            pairs.append((name, _name_of(cells, base)))
    return pairs


def _started_baselines(cells: dict[str, CellResult], baseline_kv: str) -> list[str]:
    """Started baseline cells, smallest max_model_len first (the cross-length references)."""
    names = [name for name, facts in cells.items() if facts.kv_spec == baseline_kv and facts.started]
    return sorted(names, key=lambda name: cells[name].max_model_len)


def _length_reference(prompt_id: str, name: str, ordered: list[str],
                      records: dict[str, dict[str, GenerationRecord]]) -> str | None:
    """The smallest-length baseline cell that accepted this prompt, if it is not `name` itself.

    Per prompt, because a long prompt is refused at the smallest length; it is then compared
    against the next smallest length that took it.
    """
    for other in ordered:
        if _accepted(records[other].get(prompt_id)):
            return None if other == name else other
    return None


def _row(prompt: Prompt, cell: str, reference: str, comparison: str, a: GenerationRecord,
         b: GenerationRecord) -> dict[str, Any]:
    return {"workload": prompt.workload, "prompt": prompt.id, "cell": cell, "reference": reference,
            "comparison": comparison, **compare_outputs(a, b)}


def diff_pairs(workloads: list[dict[str, Any]], cells: dict[str, CellResult], baseline_kv: str = BASELINE_KV) -> pd.DataFrame:
    """One row per (prompt, comparison) where both outputs were accepted; see the module doc."""
    records = {name: generation_records(facts) for name, facts in cells.items()}
    kv_pairs = _kv_references(cells, baseline_kv)
    ordered = _started_baselines(cells, baseline_kv)
    rows = []
    for prompt in prompts_of(workloads):
        pid = prompt.id
        for cell, reference in kv_pairs:
            a, b = records[cell].get(pid), records[reference].get(pid)
            if a is not None and b is not None and _accepted(a) and _accepted(b):
                rows.append(_row(prompt, cell, reference, "kv", a, b))
        for cell in ordered:
            length_reference = _length_reference(pid, cell, ordered, records)
            a = records[cell].get(pid)
            if length_reference is not None and a is not None and _accepted(a):
                rows.append(_row(prompt, cell, length_reference, "length", a, records[length_reference][pid]))
    frame = pd.DataFrame(rows, columns=[c for c in PAIR_COLUMNS if c != "prefix_only"])
    frame = frame.astype({"first_divergent_token": "Int64"})
    # Same tokens until the shorter output stopped (e.g. cut by a smaller max_model_len): a length
    # difference, not a divergence — counted apart so it is not read as drift.
    shorter = frame[["tokens", "reference_tokens"]].min(axis=1)
    prefix_only = (~frame.identical.astype(bool)) & (frame.first_divergent_token == shorter).fillna(False)
    return frame.assign(prefix_only=prefix_only.astype(bool))[PAIR_COLUMNS]


def diff_summary(pairs: pd.DataFrame) -> pd.DataFrame:
    """Per (workload, cell, reference, comparison): exact-match rate, median similarity and length ratio."""
    if pairs.empty:
        return pd.DataFrame(columns=SUMMARY_COLUMNS)
    grouped = pairs.groupby(["workload", "cell", "reference", "comparison"], sort=False)
    summary = grouped.agg(identical=("identical", "sum"), compared=("identical", "size"),
                          median_similarity=("similarity", "median"),
                          median_length_ratio=("length_ratio", "median"),
                          earliest_divergence=("first_divergent_token", "min"),
                          prefix_only=("prefix_only", "sum")).reset_index()
    summary = summary.astype({"identical": int, "prefix_only": int})
    return summary.assign(exact_match_rate=summary.identical / summary.compared)[SUMMARY_COLUMNS]


def first_diverging_examples(pairs: pd.DataFrame) -> pd.DataFrame:
    """Per (workload, cell): the first pair (in prompt order) that diverged, with its excerpt."""
    if pairs.empty:
        return pd.DataFrame(columns=EXAMPLE_COLUMNS)
    diverged = pairs[~pairs.identical.astype(bool)]
    first = diverged.groupby(["workload", "cell"], sort=False).head(1)
    return first[EXAMPLE_COLUMNS].reset_index(drop=True)
