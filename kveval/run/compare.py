"""One `kveval compare` run after its set-up (run/setup.py): the matrix loop.

    run_matrix   every planned cell, the verdict on them, the remedy cells an FP8 FAIL asks for, quality
                 references, --search's candidates, and rounds of task samples, probes and documents for
                 cells still undecided (run/rounds.py)
"""
from __future__ import annotations

import time

from kveval.errors import KvevalError, RunInterrupted
from kveval.files import schema
from kveval.gate import Thresholds
from kveval.inputs.kvspec import KVSpec
from kveval.pipeline import judge_stored_run, stored_run_verdict
from kveval.run.calibration import checkpoints_for
from kveval.run.cells import run_plans
from kveval.run.fork_server import ForkServer
from kveval.run.parent_clock import LOOK
from kveval.run.plan import cell_plan
from kveval.run.reference import plan_references
from kveval.run.remedy import plan_remedy
from kveval.run.rounds import run_task_rounds
from kveval.run.search import SEARCH_DTYPE, ladder, search_step, statuses_of
from kveval.run.setup import RunSetup
from kveval.run.starter import end_starter
from kveval.run.warm_process import WarmProcess


def run_matrix(setup: RunSetup, thresholds: Thresholds, show) -> None:
    """Every planned cell; then, when the verdict asks for it, the remedy cells (kept in the manifest).
    Ctrl-C keeps finished cells and writes a partial review before it stops the run."""
    run, state, options = setup.run, setup.state, setup.options
    # The fork server, or the next cell's process started while this one runs; ended with the run.
    warm = setup.starter
    try:
        clock = setup.clock
        run_plans(run, setup.plans, setup.reuse, options, show, setup.devices, setup.ray, warm, clock,
                  setup.base_env, setup.works)
        _run_quality_references(setup, show, warm)
        run_cells = lambda plans: run_plans(run, plans, True, options, show, setup.devices, setup.ray, warm,  # noqa: E731
                                            clock, setup.base_env)
        if options.search:
            run_task_rounds(setup, thresholds, show, run_cells)
            _search(setup, thresholds, show, run_cells)
        # A plain FP8 cell may FAIL only once task rounds have decided it: then its remedy runs in a second pass.
        for attempt in range(0 if options.search else 2):
            # A look only decides what runs next: the review is written once, at the end (api.report).
            with setup.clock.step(LOOK):
                evidence, verdict = stored_run_verdict(run, state.manifest, state.cells(), thresholds)
            remedy = plan_remedy(verdict, evidence, options.remedy)
            extra = [cell_plan(options, setup.model.path, setup.phase_options, spec, length, setup.baseline_dtype,
                               setup.calibrated)
                     for spec, length in remedy.cells]
            if attempt and not extra:
                break
            if remedy.notes:
                stored = state.manifest
                earlier = stored.remedy.cells if stored.remedy is not None else []  # a resume's, or the first pass's
                state.change(remedy={"mode": options.remedy, "notes": remedy.notes,
                                     "cells": list(dict.fromkeys([*earlier, *(plan.id for plan in extra)]))},
                             cells=state.with_planned(extra))
                for note in remedy.notes:
                    show.note(note)
            run_plans(run, extra, True, options, show, setup.devices, setup.ray, warm, clock, setup.base_env)
            # Cells undecided only by task accuracy: more task samples, in rounds, until decided or the budget is spent.
            run_task_rounds(setup, thresholds, show, run_cells)
        _note_run_time(setup)
    except KeyboardInterrupt:
        end_starter(warm)   # no process left waiting while the partial review is written
        # Finished cells are on disk already; render what exists so the user has a review now.
        _note_run_time(setup)
        judge_stored_run(run, state.manifest, state.cells(), thresholds)
        raise RunInterrupted(run.path) from None
    finally:
        end_starter(warm)
        if setup.ray is not None:
            setup.ray.close()


def _search(setup: RunSetup, thresholds: Thresholds, show, run_cells) -> None:
    """--search: the next candidate of run/search.ladder at every length not yet decided, judged by the
    same gate (task rounds included), until one PASSes at each length or the ladder is exhausted."""
    run, state, options = setup.run, setup.state, setup.options
    unavailable: dict[str, str] = {}
    ran: set[str] = set()
    lengths = [int(x) for x in options.max_model_len]
    while True:
        with setup.clock.step(LOOK):
            evidence, verdict = stored_run_verdict(run, state.manifest, state.cells(), thresholds)
        diagnosis = evidence.diagnosis.get(SEARCH_DTYPE)
        candidates = [spec for spec in ladder(diagnosis if isinstance(diagnosis, schema.Diagnosis) else None)
                      if spec.text not in unavailable]
        statuses, reasons = statuses_of(verdict, evidence)
        outcomes = search_step(candidates, lengths, statuses, reasons)
        by_text = {spec.text: spec for spec in candidates}
        wanted = list(dict.fromkeys(by_text[outcome.next] for outcome in outcomes if outcome.next))
        missing = [spec for spec in wanted if spec.scaled and spec.scaled not in setup.calibrated]
        for scaled in dict.fromkeys(spec.scaled for spec in missing):
            try:
                made = checkpoints_for([KVSpec(SEARCH_DTYPE, scaled=scaled)], setup.model.path, setup.tokenizer,
                                       setup.model.name, show.note, setup.trust_remote_code)
            except KvevalError as error:   # a candidate that cannot be prepared is skipped, with why
                unavailable.update({spec.text: str(error) for spec in ladder(None) + candidates if spec.scaled == scaled})
                show.note(f"Search: fp8 with {scaled} scales skipped: {error}")
                continue
            setup.calibrated.update({word: checkpoint.path for word, checkpoint in made.items()})
            calibration = {word: schema.dump(entry) for word, entry in (state.manifest.calibration or {}).items()}
            state.change(calibration={**calibration, **{word: checkpoint.model_dump(mode="json")
                                                         for word, checkpoint in made.items()}})
        if any(spec.scaled and spec.scaled not in setup.calibrated for spec in wanted):
            continue   # recompute the step without the candidates that could not be prepared
        plans = [cell_plan(options, setup.model.path, setup.phase_options, by_text[outcome.next],
                           outcome.max_model_len, setup.baseline_dtype, setup.calibrated)
                 for outcome in outcomes if outcome.next]
        state.change(search={"candidates": [spec.text for spec in candidates], "unavailable": unavailable,
                             "lengths": [outcome.model_dump() for outcome in outcomes]},
                     cells=state.with_planned(plans))
        if not plans or {plan.id for plan in plans} <= ran:   # nothing new to run: the search has ended
            return
        ran |= {plan.id for plan in plans}
        for outcome in outcomes:
            if outcome.next:
                show.note(f"Search at {outcome.max_model_len}: trying `{outcome.next}`"
                          + (f" (after {', '.join(outcome.tried)})" if outcome.tried else ""))
        run_cells(plans)
        run_task_rounds(setup, thresholds, show, run_cells)


def _note_run_time(setup: RunSetup) -> None:
    """The run's wall time so far, into the manifest's timing: the review written next shows it."""
    timing = setup.state.manifest.timing
    if timing is not None:
        setup.state.change(timing={**schema.dump(timing), "run_seconds": round(time.monotonic() - setup.started, 3),
                                   "steps": setup.clock.record()})


def _run_quality_references(setup: RunSetup, show, warm: WarmProcess | ForkServer | None = None) -> None:
    """An `auto` cell for quality only at each length where `auto` failed for KV capacity and a tested
    cell started (run/reference.py); kept in the manifest so that a resume reuses it."""
    run, state = setup.run, setup.state
    planned, unplanned = plan_references(state.cells(), setup.plans, state.manifest, setup.options.reference)
    for line in unplanned:
        show.note(f"No quality reference: {line}")
    if not planned:
        return
    references = dict(state.manifest.quality_references or {})
    for reference in planned:
        references[reference.plan.id] = reference.record
        show.note(f"Quality reference: {reference.why}")
    state.change(quality_references={cell: schema.dump(entry) for cell, entry in references.items()},
                 cells=state.with_planned([reference.plan for reference in planned]))
    run_plans(run, [reference.plan for reference in planned], True, setup.options, show, setup.devices, setup.ray, warm,
              setup.clock, setup.base_env)
