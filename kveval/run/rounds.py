"""Evidence until decided: after the planned (and remedy) cells, rounds of new task samples, of new
degeneration probes and of new scoring documents for the cells still undecided by them, until each is
decided or the budget is spent.

Per round and length: new task data (another seed, ids ending in -r<k>) in taskdata/L<len>/r<k>/, new
probes (questions from data/probes_rounds.jsonl no earlier round used) in rounds/probes-r<k>.json and/or
new documents (other corpus text, ids doc:r<k>:<size>) in rounds/documents-r<k>-L<len>.json; the `auto`
baseline and each undecided cell run the tasks, generation and/or scoring phase on those, each in its
own cell process, stored as cells/<cell>.tasks-r<k>.json; RunDir.cell_results pools the rounds'
samples, outputs and scored documents into the cell (files/task_rounds.py) and the gate judges every
look at the alpha it may spend (analysis/sequential.py). The manifest's `task_rounds` records the budget, the
rounds and the cells whose last look is final.

Resuming: the plan is a function of the stored files (round time is the stored processes' seconds, not
the clock), so the same command plans the same rounds and finished round cells are reused.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

from kveval.analysis.cell_records import stored_spec
from kveval.files import schema
from kveval.files.cell_spec import CellSpec, TasksOptions
from kveval.files.rundir import RunDir, StoreError, read_json, write_json_atomic
from kveval.files.task_rounds import round_cell_id
from kveval.gate import Thresholds
from kveval.inputs.budget import parse_budget
from kveval.inputs.kvspec import KVSpec
from kveval.inputs.model_config import ModelSource, load_tokenizer, model_facts
from kveval.inputs.task_data import TASKS, write_task_data
from kveval.inputs.workloads import round_probe_pool_size, round_probe_prompts, with_chat_template_kwargs
from kveval.pipeline import stored_run_verdict
from kveval.run.cell_process import CellPlan
from kveval.run.parent_clock import LOOK, ROUND_DATA
from kveval.run.plan import cell_plan, scoring_documents
from kveval.run.setup import RunSetup
from kveval.run.state import RunState
from kveval.run.round_plan import (DIVERGENCE_CODES, MAX_SCORED_SEQUENCES, MAX_ROUNDS, Costs, LengthRound, LengthShape,
                                   RoundPlan, plan_round, scored_sequence_count, task_decided)
from kveval.inputs.suites import SUITES

RunCells = Callable[[list[CellPlan]], None]


def round_shapes(manifest: schema.Manifest) -> dict[int, LengthShape]:
    """Per length with kveval task data: tasks there and docs per --task-samples step (manifest task_data)."""
    per_point = max(1, manifest.options.samples_per_point or 1)
    shapes = {}
    for length, files in manifest.task_data.files.items():
        made = [f for name, f in files.items() if name in TASKS and f.file]
        docs = sum(f.docs for f in made)
        if made and docs:
            shapes[int(length)] = LengthShape(len(made), max(1, docs // per_point))
    return shapes


def _seconds_per_item(cells: dict[str, schema.CellResult], phase_name: str, items: str) -> float | None:
    """A phase's seconds per item (its `items` list) over the cells run."""
    seconds = count = 0.0
    for facts in cells.values():
        phase = getattr(facts.phases, phase_name)
        listed = getattr(phase, items, None) if phase is not None else None
        if phase is not None and phase.seconds and listed:
            seconds += float(phase.seconds)
            count += len(listed)
    return seconds / count if count else None


def _seconds_per_output(cells: dict[str, schema.CellResult]) -> float | None:
    """Generation seconds per output over the cells run (long context prompts included: an upper figure
    for a short probe)."""
    return _seconds_per_item(cells, "generation", "records")


def _seconds_per_document(cells: dict[str, schema.CellResult]) -> float | None:
    """Scoring seconds per sequence over the cells run (an upper figure: the noise re-score counts too)."""
    return _seconds_per_item(cells, "scoring", "sequences")


def round_costs(cells: dict[str, schema.CellResult], evidence: schema.Evidence) -> Costs | None:
    """Start-up, task seconds per doc, generation seconds per output and scoring seconds per document
    from the cells already run (None before any of them ran)."""
    tasks = evidence.tasks
    pace = tasks.pace if isinstance(tasks, schema.TaskEvidence) else None
    per_doc = pace.seconds_per_sample if pace else None
    per_probe = _seconds_per_output(cells)
    per_document = _seconds_per_document(cells)
    starts = [f.startup_seconds for f in cells.values() if f.started and f.startup_seconds]
    if not per_doc and not per_probe and not per_document:
        return None
    return Costs(sum(starts) / len(starts) if starts else 0.0, float(per_doc or per_probe or per_document),
                 per_probe, per_document)


def seconds_used(run: RunDir, rounds: list[schema.TaskRound]) -> float:
    """Engine time the stored round cells took (their processes' seconds)."""
    total = 0.0
    for entry in rounds:
        for cell in entry.cells:
            try:
                facts = run.cell_result(round_cell_id(cell, entry.round))
            except StoreError:
                facts = None
            if facts is not None and facts.process is not None:
                total += float(facts.process.seconds or 0.0)
    return total


def _round_plans(setup: RunSetup, number: int, length_round: LengthRound, data_dir: str | None, probes_file: str | None,
                 kv_of: dict[str, KVSpec], references: dict[str, schema.ReferenceCell],
                 documents_file: str | None = None) -> list[CellPlan]:
    """One cell plan per cell of the round, engine settings as the cell's own: the tasks phase for its
    task cells, the generation phase on the round's probes for its probe cells, the scoring phase on the
    round's documents for its scoring cells (the baseline all it is paired in)."""
    plans = []
    for cell in length_round.all_cells:
        base = cell_plan(setup.options, setup.model.path, setup.phase_options, kv_of[cell], length_round.max_model_len,
                         setup.baseline_dtype, setup.calibrated)
        reference = references.get(cell)
        if reference is not None:  # a quality reference keeps the memory it was started with (run/reference.py)
            base = base.with_memory(reference.kv_cache_memory_bytes,
                                    float(reference.cpu_offload_gb) if reference.cpu_offload_gb else None)
        is_reference = cell == length_round.reference
        phases = []
        if probes_file and (cell in length_round.probe_cells or (is_reference and length_round.probe_cells)):
            phases.append("generation")
        phase_options = setup.phase_options   # efficiency_sample 0: only the run's first cell measures it
        if data_dir and (cell in length_round.task_cells or (is_reference and length_round.task_cells)):
            phases.append("tasks")
            # Only kveval's own tasks get new samples; an lm-eval task would repeat its first round's.
            tasks = TasksOptions(tasks=[t for t in setup.phase_options.tasks.tasks if t in TASKS],
                                 limit=length_round.limit, data_dir=data_dir,
                                 chat_template_kwargs=setup.phase_options.tasks.chat_template_kwargs)
            phase_options = phase_options.model_copy(update={"tasks": tasks})
        if documents_file and (cell in length_round.scoring_cells or (is_reference and length_round.scoring_cells)):
            phases.append("scoring")
            # Only the new documents: no continuations (their outputs were scored at the first look) and
            # no noise re-score (the floor is the first look's).
            scoring = phase_options.scoring.model_copy(update={"documents_file": documents_file,
                                                               "continuation_kinds": (), "noise": False})
            phase_options = phase_options.model_copy(update={"scoring": scoring})
        plans.append(dataclasses.replace(base, id=round_cell_id(cell, number), phases=phases,
                                         phase_options=phase_options,
                                         workloads=probes_file if "generation" in phases else None))
    return plans


def _forget_if_changed(run: RunDir, plan: CellPlan) -> None:
    """A stored round cell asked for other samples than this plan (another run's plan): measure it again."""
    path = run.cell_spec_path(plan.id)
    try:
        stored = read_json(path) if path.is_file() else None
    except StoreError:
        stored = None
    if stored is None:
        return
    try:
        spec = CellSpec.model_validate(stored)
    except ValueError:   # not a spec this kveval writes: not this plan's either
        spec = None

    def asked(options) -> tuple | None:
        return (options.tasks.model_dump(mode="json"), options.scoring.documents_file) if options is not None else None

    if spec is None or asked(spec.phase_options) != asked(plan.phase_options) or spec.phases != list(plan.phases):
        run.cell_path(plan.id).unlink(missing_ok=True)


class _Data:
    """Writes a round's task data and probes; the tokenizer is loaded on the first round only."""

    def __init__(self, setup: RunSetup, options: schema.Options):
        self.setup, self.options, self.tokenizer = setup, options, None

    def _tokenizer(self):
        if self.tokenizer is None:
            # Probes and task data render as the first look's did: with the run's --chat-template-kwargs.
            self.tokenizer = with_chat_template_kwargs(
                load_tokenizer(ModelSource.of(self.setup.model.path, self.setup.options.engine_args)),
                self.options.chat_template_kwargs)
        return self.tokenizer

    def write_probes(self, number: int, start: int, count: int) -> dict:
        """Round `number`'s probes (questions start .. start+count of the round pool) in rounds/probes-r<k>.json."""
        prompts = round_probe_prompts(self._tokenizer(), number, start, count, seed=self.options.seed)
        path = self.setup.run.round_probes_path(number)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, [p.to_dict() for p in prompts], compact=True)
        return {"file": str(path.relative_to(self.setup.run.path)), "start": start, "count": len(prompts)}

    def write_documents(self, number: int, length_round: LengthRound) -> str:
        """Round `number`'s new documents at the round's length, sized as the suite's (other corpus text:
        another seed), in rounds/documents-r<k>-L<len>.json; the path relative to the run."""
        options = self.options
        suite = SUITES.get(options.suite) if options.suite else None
        fractions = suite.scoring_doc_fractions if suite else (0.55, 0.9)
        limit = model_facts(ModelSource.of(self.setup.model.path, self.setup.options.engine_args)).max_position_embeddings
        documents = scoring_documents(self._tokenizer(), [length_round.max_model_len], length_round.documents,
                                      fractions, limit, options.seed, round_number=number)
        path = self.setup.run.round_documents_path(number, length_round.max_model_len)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, documents, compact=True)
        return str(path.relative_to(self.setup.run.path))

    def write(self, number: int, length_round: LengthRound) -> str:
        setup = self.setup
        self._tokenizer()
        options = self.options
        relative = f"{RunDir.TASK_DATA_DIR}/L{length_round.max_model_len}/r{number}"
        write_task_data(self.tokenizer, setup.run.task_data_path(relative), length_round.max_model_len,
                        [t for t in options.tasks if t in TASKS], fractions=options.lengths,
                        depths=options.depths, samples_per_point=length_round.samples_per_point,
                        seed=options.seed, round_number=number)
        return relative


def _paired(evidence: schema.Evidence) -> dict[str, int]:
    """Per cell, paired task samples plus judged probe outputs plus scored documents: what a round must
    add to."""
    out: dict[str, int] = {}
    for comp in evidence.divergence.comparisons if evidence.divergence else []:
        if comp.kind == "kv":
            out[comp.cell] = out.get(comp.cell, 0) + scored_sequence_count(comp)
    tasks = evidence.tasks
    for cell, entry in (tasks.cells if isinstance(tasks, schema.TaskEvidence) else {}).items():
        out[cell] = entry.n
    for cell, degeneration in evidence.degeneration.cells.items():
        if degeneration.judged_outputs:
            out[cell] = out.get(cell, 0) + degeneration.judged_outputs
    return out


def _probes_used(rounds: list[schema.TaskRound]) -> int:
    """Round-pool probes drawn so far (each round's file once)."""
    seen = {}
    for entry in rounds:
        if entry.probes is not None:
            seen[entry.probes.file] = entry.probes.start + entry.probes.count
    return max(seen.values(), default=0)


def run_task_rounds(setup: RunSetup, thresholds: Thresholds, show, run_cells: RunCells) -> None:
    """Rounds until every tested cell is decided by its task samples and probe outputs or the budget is
    spent; then the cells whose task or degeneration comparison is still open are marked final (their
    last look spends the alpha left)."""
    budget = parse_budget(setup.options.budget)
    stored = setup.state.manifest   # as set-up (or a resume) left it: the earlier record, if any
    shapes = round_shapes(stored)
    task_rounds = "tasks" in setup.options.phases and bool(shapes)
    probe_pool = round_probe_pool_size() if "generation" in setup.options.phases else 0
    scoring = "scoring" in setup.options.phases
    if not budget.samples or not (task_rounds or probe_pool or scoring):
        return
    run, state = setup.run, setup.state
    # Planned afresh on a resume too: the plan is a function of the stored files, so finished round cells
    # are reused (module docstring).
    # A larger --budget extends the design: rounds an earlier record planned are planned again under the
    # N_max they had, so their looks keep the alpha they spent (analysis/sequential.py).
    caps = _earlier_caps(stored.task_rounds, budget.samples)
    # A stream whose last look was final in that record spent all its alpha: past the record's rounds
    # (replayed as they were), it gets no more.
    closed, replayed = _finalized(stored.task_rounds)
    record = {"budget": budget.to_dict(), "n_max": budget.samples, "rounds": [], "final": [], "stopped": None,
              "notes": [], "final_degeneration": [], "first_n_max": caps.get(0, budget.samples),
              "documents_n_max": MAX_SCORED_SEQUENCES if scoring else None, "final_divergence": []}
    state.change(task_rounds=record)
    data = _Data(setup, stored.options)
    references = stored.quality_references or {}
    stopped = f"{MAX_ROUNDS} rounds, the most kveval runs"
    waiting: dict[str, int] = {}   # cells of the last round -> their paired samples before it
    for number in range(1, MAX_ROUNDS + 2):
        # A look only plans the next round: the review is written once, at the end (api.report).
        with setup.clock.step(LOOK):
            cells = state.cells()
            evidence, verdict = stored_run_verdict(run, state.manifest, cells, thresholds)
        rounds_run = state.manifest.task_rounds.rounds
        paired = _paired(evidence)
        if waiting and not any(paired.get(c, 0) > n for c, n in waiting.items()):
            stopped = f"round {number - 1} paired no new sample (see its cells' logs)"
            break
        if number > MAX_ROUNDS:
            break
        cap = caps.get(number, budget.samples)
        plan = plan_round(verdict, evidence, dataclasses.replace(budget, samples=cap), thresholds,
                          shapes if task_rounds else {},
                          round_costs(cells, evidence), seconds_used(run, rounds_run),
                          probes_left=max(0, probe_pool - _probes_used(rounds_run)) if probe_pool else None,
                          scoring=scoring, closed=closed if number > replayed else None)
        record["notes"] = plan.notes
        if not plan.rounds:
            stopped = _why_stopped(plan)
            break
        waiting = {c: paired.get(c, 0) for r in plan.rounds for c in r.cells}
        kv_of = {name: stored_spec(facts.kv_spec) for name, facts in cells.items()}
        probe_count = max(r.probes for r in plan.rounds)
        with setup.clock.step(ROUND_DATA):
            probes = data.write_probes(number, _probes_used(rounds_run), probe_count) if probe_count else None
        plans = []
        for length_round in plan.rounds:
            with setup.clock.step(ROUND_DATA):
                relative = data.write(number, length_round) if length_round.task_cells else None
                documents = data.write_documents(number, length_round) if length_round.scoring_cells else None
            record["rounds"].append({"round": number, "max_model_len": length_round.max_model_len,
                                     "cells": length_round.all_cells, "data_dir": relative,
                                     "samples_per_point": length_round.samples_per_point,
                                     "limit": length_round.limit, "target": length_round.target,
                                     # The baseline (first) takes part in every stream of the round.
                                     "task_cells": _with_reference(length_round, length_round.task_cells),
                                     "probe_cells": _with_reference(length_round, length_round.probe_cells),
                                     "probes": probes if length_round.probe_cells else None,
                                     "probe_target": length_round.probe_target or None, "n_max": cap,
                                     "scoring_cells": _with_reference(length_round, length_round.scoring_cells),
                                     "documents": documents, "document_target": length_round.document_target or None})
            plans += _round_plans(setup, number, length_round, relative,
                                  probes["file"] if probes and length_round.probe_cells else None, kv_of, references,
                                  documents)
            show.note(_round_note(number, length_round))
        state.change(task_rounds=record)
        for cell_round in plans:
            _forget_if_changed(run, cell_round)
        run_cells(plans)
    _finish(state, record, evidence, verdict, stopped, show)


def _finalized(earlier: schema.TaskRounds | None) -> tuple[dict[str, set[str]], int]:
    """The streams (tasks, probes, scoring) whose last look the earlier record made final, per stream the
    cells, and the number of that record's last round."""
    if earlier is None or not earlier.n_max:
        return {}, 0
    closed = {"tasks": set(earlier.final), "probes": set(earlier.final_degeneration),
              "scoring": set(earlier.final_divergence or [])}
    return closed, max((r.round for r in earlier.rounds), default=0)


def _earlier_caps(earlier: schema.TaskRounds | None, n_max: int) -> dict[int, int]:
    """Per round of an earlier record of this run (0: the first look), the N_max it was planned under,
    never above this run's."""
    if earlier is None or not earlier.n_max:
        return {}
    caps = {0: earlier.first_n_max or earlier.n_max}
    caps.update({r.round: r.n_max or earlier.n_max for r in earlier.rounds})
    return {k: min(cap, n_max) for k, cap in caps.items()}


def _with_reference(length_round: LengthRound, cells: list[str]) -> list[str]:
    return [length_round.reference, *cells] if cells else []


def _round_note(number: int, length_round: LengthRound) -> str:
    parts = []
    if length_round.task_cells:
        parts.append(f"{', '.join(length_round.task_cells)} undecided by task accuracy: about {length_round.docs} new "
                     f"task samples each (aiming at {length_round.target} paired)")
    if length_round.probe_cells:
        parts.append(f"{', '.join(length_round.probe_cells)} undecided by degeneration: {length_round.probes} new probes "
                     f"each (aiming at {length_round.probe_target} judged outputs)")
    if length_round.scoring_cells:
        parts.append(f"{', '.join(length_round.scoring_cells)} undecided by divergence: {length_round.documents} new "
                     f"documents each (aiming at {length_round.document_target} scored)")
    return f"Round {number} at {length_round.max_model_len}: {'; '.join(parts)}; with {length_round.reference}"


def _why_stopped(plan: RoundPlan) -> str:
    if plan.notes:
        return "; ".join(plan.notes)
    return "every tested cell is decided, or undecided for a reason more task samples and probes cannot settle"


def _finish(state: RunState, record: dict, evidence, verdict, stopped: str, show) -> None:
    """Mark as final every tested cell whose task or degeneration comparison is still open at the last
    judgment (`evidence` and `verdict`, of every round's samples): no look follows, so the last one spends the alpha left."""
    tasks = evidence.tasks
    tested = list(tasks.cells) if isinstance(tasks, schema.TaskEvidence) else []
    record["final"] = [name for name in tested if not task_decided(verdict, name)]
    record["final_degeneration"] = [c.cell for c in verdict.checks
                                    if c.name == "degeneration_noninferiority" and c.passed is None]
    if record.get("documents_n_max"):
        record["final_divergence"] = sorted({r.cell for r in verdict.reasons
                                             if r.code in DIVERGENCE_CODES and r.cell is not None})
    record["stopped"] = stopped
    state.change(task_rounds=record)
    if record["rounds"]:
        show.note(f"Rounds stopped: {stopped}")
