"""A cell's evidence pooled over rounds: the first tasks and generation phases plus every later round's
(run/rounds.py).

A round runs the tasks phase on new samples, the generation phase on new degeneration probes and/or
the scoring phase on new documents, in its own cell process; its result is stored beside the cell as cells/<cell>.tasks-r<k>.json (a cell record
of its own). Readers see one cell: its tasks phase holds the samples of every round and its generation
phase the outputs of every round and its scoring phase the sequences of every round, each tagged with
its round (0: the first), so the paired comparisons
pool them (pairing is by sample or prompt id, and round ids never collide) and the gate can tell the
looks apart.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence, overload

from kveval.files import schema
from kveval.files.schema import (CellResult, GenerationDesign, GenerationPhase, ProbeRound, ScoringDesign,
                                 ScoringPhase, TaskRoundOutcome, TasksDesign, TasksPhase)


def round_cell_id(cell: str, round_number: int) -> str:
    """The id (and file stem) of a cell's k-th task round."""
    return f"{cell}.tasks-r{round_number}"


def _rounds(manifest: schema.Manifest | None) -> list[schema.TaskRound]:
    record = manifest.task_rounds if manifest is not None else None
    return record.rounds if record is not None else []


def rounds_of(manifest: schema.Manifest | None, cell: str) -> list[int]:
    """The rounds the manifest planned for `cell`, in order."""
    return [r.round for r in _rounds(manifest) if cell in r.cells]


@dataclass(frozen=True)
class RoundStreams:
    """Of a cell's rounds, those that sampled tasks, those that generated degeneration probes and those
    that scored new documents."""

    tasks: list[int]
    probes: list[int]
    scoring: tuple[int, ...] = ()


def streams_of(manifest: schema.Manifest | None, cell: str) -> RoundStreams:
    """Which of `cell`'s rounds ran tasks, probes and documents; a round from before probe rounds (no
    task_cells list) ran tasks for all its cells."""
    tasks, probes, scoring = [], [], []
    for entry in _rounds(manifest):
        if cell not in entry.cells:
            continue
        if entry.task_cells is None or cell in entry.task_cells:
            tasks.append(entry.round)
        if cell in (entry.probe_cells or []):
            probes.append(entry.round)
        if cell in (entry.scoring_cells or []):
            scoring.append(entry.round)
    return RoundStreams(tasks, probes, tuple(scoring))


@dataclass(frozen=True)
class RoundDesign:
    """The sequential design as it applies to one cell (`design_of`); each phase carries its part."""

    n_max: int                       # the budget's paired samples per cell, task samples and probe outputs alike
    final: bool                      # its last task look spends the alpha left
    final_degeneration: bool = False  # the same for its degeneration comparison
    stopped: str | None = None
    documents_n_max: int | None = None   # the scored documents' budget; None: no scoring rounds
    final_divergence: bool = False
    n_max_rounds: list[int] | None = None   # where a larger --budget extended the design (sequential.look_alpha)

    def tasks(self) -> TasksDesign:
        return TasksDesign(n_max=self.n_max, final=self.final, stopped=self.stopped,
                           **({"n_max_rounds": self.n_max_rounds} if self.n_max_rounds else {}))

    def generation(self) -> GenerationDesign:
        return GenerationDesign(n_max=self.n_max, final=self.final_degeneration,
                                **({"n_max_rounds": self.n_max_rounds} if self.n_max_rounds else {}))

    def scoring(self) -> ScoringDesign | None:
        if not self.documents_n_max:
            return None
        return ScoringDesign(n_max=self.documents_n_max, final=self.final_divergence)


def design_of(manifest: schema.Manifest | None, cell: str) -> RoundDesign | None:
    """The sequential design as it applies to `cell`; None for runs without rounds or with --budget 0."""
    rounds = manifest.task_rounds if manifest is not None else None
    if rounds is None or not rounds.n_max:
        return None
    caps = n_max_rounds(rounds)
    return RoundDesign(n_max=rounds.n_max, final=cell in rounds.final,
                       final_degeneration=cell in rounds.final_degeneration, stopped=rounds.stopped,
                       documents_n_max=rounds.documents_n_max or None,
                       final_divergence=bool(rounds.documents_n_max) and cell in rounds.final_divergence,
                       n_max_rounds=caps if any(cap != rounds.n_max for cap in caps) else None)


def n_max_rounds(rounds: schema.TaskRounds) -> list[int]:
    """The N_max in force at the look after each round (index 0: the first look, before any round): old
    looks keep the N_max they were judged under, so the alpha they spent stays spent."""
    caps = [rounds.first_n_max or rounds.n_max]
    for entry in sorted(rounds.rounds, key=lambda r: r.round):
        while len(caps) <= entry.round:
            caps.append(rounds.n_max)
        caps[entry.round] = entry.n_max or rounds.n_max
    return caps


def _round_failure(record: CellResult | None, error: str | None) -> str | None:
    """What went wrong in a round: its phase's error, the crash, the start-up failure, or no file at all."""
    if record is None:
        return error or "no result file"
    return (error or (record.crash.message if record.crash else None)
            or (record.failure.message if record.failure else None))


def _merged_generation(phase: GenerationPhase | None, rounds: list[tuple[int, CellResult | None]],
                       design: RoundDesign | None) -> GenerationPhase | None:
    """The cell's generation phase with every round's probe outputs appended (tagged with the round)."""
    if phase is None or phase.error:
        return phase
    update: dict[str, Any] = {}
    if design:
        update["design"] = design.generation()
    if rounds:
        records = [record if "round" in record.model_fields_set else record.model_copy(update={"round": 0})
                   for record in phase.records or []]
        outcomes = []
        for number, record in rounds:
            extra = record.phases.generation if record else None
            added = [out.model_copy(update={"round": number}) for out in (extra.records or [] if extra else [])]
            records += added
            outcomes.append(ProbeRound(round=number, outputs=len(added), started=bool(record and record.started),
                                       error=_round_failure(record, extra.error if extra else None)))
        update.update(records=records, rounds=outcomes)
    return phase.model_copy(update=update) if update else phase


def _merged_tasks(phase: TasksPhase | None, rounds: list[tuple[int, CellResult | None]],
                  design: RoundDesign | None) -> TasksPhase | None:
    """The cell's tasks phase with every round's samples appended (tagged with the round) and the design."""
    if phase is None or phase.error:
        return phase
    update: dict[str, Any] = {}
    if design:
        update["design"] = design.tasks()
    if rounds:
        samples = [sample.model_copy(update={"round": 0}) for sample in phase.samples or []]
        seconds, outcomes = phase.seconds, []
        for number, record in rounds:
            extra = record.phases.tasks if record else None
            added = [sample.model_copy(update={"round": number}) for sample in (extra.samples or [] if extra else [])]
            samples += added
            if extra is not None and extra.seconds:
                seconds = (seconds or 0.0) + extra.seconds
            outcomes.append(TaskRoundOutcome(
                round=number, samples=len(added), started=bool(record and record.started),
                error=_round_failure(record, extra.error if extra else None),
                task_errors=dict(extra.task_errors or {}) if extra else {},
                seconds=record.process.seconds if record and record.process else None))
        update.update(samples=samples, rounds=outcomes)
        if seconds != phase.seconds:
            update["seconds"] = seconds
    return phase.model_copy(update=update) if update else phase


def _merged_scoring(phase: ScoringPhase | None, rounds: list[tuple[int, CellResult | None]],
                    design: RoundDesign | None) -> ScoringPhase | None:
    """The cell's scoring phase with every round's newly scored documents appended (tagged with the round)
    and the divergence design; a round that failed adds nothing (its cell file says why)."""
    if phase is None or phase.error:
        return phase
    update: dict[str, Any] = {}
    scoring_design = design.scoring() if design else None
    if scoring_design is not None:
        update["design"] = scoring_design
    if rounds:
        sequences = [s.model_copy(update={"round": 0}) for s in phase.sequences or []]
        for number, record in rounds:
            extra = record.phases.scoring if record and record.started else None
            sequences += [s.model_copy(update={"round": number}) for s in (extra.sequences or [] if extra else [])]
        update["sequences"] = sequences
    return phase.model_copy(update=update) if update else phase


@overload
def merge_rounds(facts: CellResult, rounds: Sequence[tuple[int, CellResult | dict[str, Any] | None]],
                 design: RoundDesign | None = None, streams: RoundStreams | None = None) -> CellResult: ...
@overload
def merge_rounds(facts: dict[str, Any], rounds: Sequence[tuple[int, CellResult | dict[str, Any] | None]],
                 design: RoundDesign | None = None, streams: RoundStreams | None = None) -> dict[str, Any]: ...
def merge_rounds(facts: CellResult | dict[str, Any], rounds: Sequence[tuple[int, CellResult | dict[str, Any] | None]],
                 design: RoundDesign | None = None,
                 streams: RoundStreams | None = None) -> CellResult | dict[str, Any]:
    """`facts` with the task samples and probe outputs of every round appended and the design noted (a
    new cell: `facts` is left as it was; facts with neither rounds nor a design come back as they are).
    `rounds`: the cell's rounds with their records; `streams`: which of them sampled tasks and which
    probes (None: all tasks, as before probe rounds existed). A round that did not start, crashed or
    failed adds nothing; it is listed under the phase's `rounds` with what happened, never as the
    phase's own error (the first round's samples still stand). Typed cells in, a typed cell out; plain
    dicts (as read from the files) are validated and a plain dict comes back."""
    if not (rounds or design):
        return facts
    if isinstance(facts, dict):
        typed = [(number, None if record is None else _typed(record, f"round {number} of {facts.get('cell')}"))
                 for number, record in rounds]
        return schema.dump(merge_rounds(_typed(facts, str(facts.get("cell"))), typed, design, streams))
    streams = streams or RoundStreams([n for n, _ in rounds], [])
    records = [(number, None if record is None else _typed(record, f"round {number} of {facts.cell}"))
               for number, record in rounds]
    phases = facts.phases
    merged: dict[str, Any] = {"generation": _merged_generation(phases.generation, [(n, r) for n, r in records if n in streams.probes],
                                               design),
              "tasks": _merged_tasks(phases.tasks, [(n, r) for n, r in records if n in streams.tasks], design),
              "scoring": _merged_scoring(phases.scoring, [(n, r) for n, r in records if n in streams.scoring],
                                         design)}
    # Only the phases the cell has: a phase it never ran stays absent.
    update = {name: phase for name, phase in merged.items() if phase is not getattr(phases, name)}
    return facts.model_copy(update={"phases": phases.model_copy(update=update)}) if update else facts


def _typed(record: CellResult | dict[str, Any], name: str) -> CellResult:
    return record if isinstance(record, CellResult) else schema.parse(CellResult, record, name)
