"""`kveval compare --search`: the KV configurations the engine offers, tried in order of capacity until
one PASSes at each max_model_len (issue 20). Pure: reads the verdict, the evidence and the diagnosis.

The ladder, most capacity first (each candidate a cell judged by the same gate, task rounds included):
1. `fp8`: the checkpoint's scales (1.0 without), 2× the `auto` pool;
2. `fp8:scaled`: per-tensor K/V scales calibrated with llm-compressor (same pool);
3. `fp8:scaled=head`: per-attention-head scales (same pool; vLLM reads them on Flash Attention only);
4. `fp8:keep=L`: the diagnosed layers kept in the model dtype, fewest first (the worst layer, then the
   worst 2, 4, ... of them, then all, unless all are every layer of the model): each kept layer costs pool;
5. `fp8:scaled,keep=L`: the same layer sets with calibrated scales.
Scaled candidates come before kept layers because they keep the whole 2× pool; among equal pools the
simpler one is tried first. At a length, the search stops at the first candidate that PASSes, moves
on past one that FAILs, stays INCONCLUSIVE once task rounds spent the budget, or did not start (vLLM's
reason is kept), and ends with "none passes" when the ladder is exhausted. When plain FP8 itself did
not start, no FP8 candidate can (same dtype, same pool or less): the length ends there, with that reason.
"""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from kveval.analysis.kv_range import keeps_every_layer
from kveval.files import schema
from kveval.files.rundir import cell_id
from kveval.gate import NOT_STARTED, PASS
from kveval.inputs.kvspec import KVSpec, keep_spec

SEARCH_DTYPE = "fp8"


def _layers_by_severity(diagnosis: schema.Diagnosis | None) -> list[int]:
    """The diagnosed layers (clipping ones, else the outliers), the worst K/V-to-limit ratio first."""
    if diagnosis is None or diagnosis.error:
        return []
    chosen = set(diagnosis.offending_layers or []) or set(diagnosis.outlier_layers or [])
    worst: dict[int, float] = {}
    for row in diagnosis.rows:
        if row.layer in chosen and row.ratio is not None:
            worst[row.layer] = max(worst.get(row.layer, 0.0), float(row.ratio))
    return sorted(chosen, key=lambda layer: (-worst.get(layer, 0.0), layer))


def _prefix_sizes(count: int) -> list[int]:
    sizes, size = [], 1
    while size < count:
        sizes.append(size)
        size *= 2
    return sizes + ([count] if count else [])


def ladder(diagnosis: schema.Diagnosis | None) -> list[KVSpec]:
    """The candidates, in the order they are tried. A keep set of every layer is left out: it is the `auto` cache
    under another name (no capacity to gain), so the search ends with "none passes" rather than try it."""
    layers = _layers_by_severity(diagnosis)
    keeps = [keep_spec(SEARCH_DTYPE, layers[:size]).keep for size in _prefix_sizes(len(layers))
             if not keeps_every_layer(diagnosis, layers[:size])]
    return ([KVSpec(SEARCH_DTYPE), KVSpec(SEARCH_DTYPE, scaled="tensor"), KVSpec(SEARCH_DTYPE, scaled="head")]
            + [KVSpec(SEARCH_DTYPE, keep) for keep in keeps]
            + [KVSpec(SEARCH_DTYPE, keep, "tensor") for keep in keeps])


class LengthOutcome(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_model_len: int
    tried: list[str]                 # candidate spec texts in the order tried (cells that exist)
    chosen: str | None = None        # the first that PASSes
    next: str | None = None          # the candidate to run next; None: the search at this length has ended
    notes: list[str] = []


def search_step(candidates: list[KVSpec], lengths: list[int], statuses: dict[str, str],
                why_not_started: dict[str, str]) -> list[LengthOutcome]:
    """Where the search stands at each length, and the next cell it needs (at most one per length)."""
    outcomes = []
    for length in sorted(set(lengths)):
        outcome = LengthOutcome(max_model_len=length, tried=[])
        for spec in candidates:
            cell = cell_id(spec.text, length)
            status = statuses.get(cell)
            if status is None:
                outcome.next = spec.text
                break
            outcome.tried.append(spec.text)
            if status == PASS:
                outcome.chosen = spec.text
                break
            if status == NOT_STARTED:
                reason = why_not_started.get(cell) or "no reason recorded"
                if spec == candidates[0]:
                    outcome.notes.append(f"{length}: `{spec.text}` did not start ({reason}); no FP8 candidate can, "
                                         "so the search ends here")
                    break
                outcome.notes.append(f"{length}: `{spec.text}` skipped: did not start ({reason})")
        else:
            outcome.notes.append(f"{length}: none of the {len(candidates)} candidates passes")
        outcomes.append(outcome)
    return outcomes


def statuses_of(verdict, evidence: schema.Evidence) -> tuple[dict[str, str], dict[str, str]]:
    """cell -> status, and cell -> why it did not start, as the search reads them."""
    words = {row.cell: row.message for row in evidence.startup if not row.started and row.message}
    reasons = {name: (f"{facts.failure_reason}: {words[name]}" if name in words and facts.failure_reason
                      else words.get(name) or facts.failure_reason or "no reason recorded")
               for name, facts in evidence.cells.items() if not facts.started}
    return dict(verdict.cells), reasons
