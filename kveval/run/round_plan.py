"""Which cells get another round of evidence, and how much (pure: verdict + evidence in, a plan out).

Three streams of paired evidence can be sampled again: task samples (new task data), degeneration
probes (new short questions, generated in the cell and its baseline) and scoring documents (new plain
documents, scored teacher-forced in the cell and its baseline: the divergence test's clusters). A tested cell gets more of a stream
while that stream's comparison is open and more of it can decide the cell: PASS is within reach when
every open reason of the cell is a stream being sampled; otherwise only a FAIL is, so a stream is sampled
only where it leans towards harm (task recovery under `task_recovery_min`; more outputs degenerating only
in the cell than only in the baseline; a KL excess over its healthy budget). Round sizes follow a schedule fixed in advance, never the data
(analysis/sequential.next_look_size): looks at n_1, 2·n_1, 4·n_1, … (a probe round adds at least
MIN_PROBE_ROUND), capped by the budget's samples per cell and cut to the round time left. The cells of one length
share a round: the same new samples and probes for them and their baseline.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from kveval.analysis.sequential import next_look_size
from kveval.analysis.cell_records import BASELINE_KV
from kveval.files import schema
from kveval.gate import INCONCLUSIVE, Thresholds, Verdict
from kveval.inputs.budget import Budget

MAX_ROUNDS = 8   # doubling from 12 paired samples reaches the default 600 in six
MIN_PROBE_ROUND = 50   # new probes per round at least
# The divergence design's N_max: scored sequences per cell at most (documents and, in the first look, the
# continuations; a scoring round adds documents only, one sequence each).
MAX_SCORED_SEQUENCES = 48
# The verdict reasons more scored documents can settle (gate/divergence_checks.py).
DIVERGENCE_CODES = ("divergence_undecided", "divergence_too_few_positions", "divergence_too_few_late_positions")


@dataclass(frozen=True)
class LengthShape:
    """What one more step of --task-samples gives at a length: kveval tasks with data there, and docs per
    step (all tasks together)."""

    tasks: int
    docs_per_step: int


@dataclass(frozen=True)
class Costs:
    """The run's pace, to fit a round into the time left: engine start-up, task time per doc and
    generation time per probe (None: not known, taken as a task doc's)."""

    startup_seconds: float
    seconds_per_doc: float
    seconds_per_probe: float | None = None
    seconds_per_document: float | None = None


@dataclass
class LengthRound:
    """One round at one length: the baseline and the undecided cells; `task_cells` get `docs` new task
    docs each, `probe_cells` the round's `probes` new degeneration probes (the baseline gets both)."""

    max_model_len: int
    reference: str
    cells: list[str]
    target: int                  # paired task samples per cell aimed for after the round (0: no task round)
    docs: int                    # new task docs per cell
    samples_per_point: int
    limit: int | None            # per task, when fewer docs than whole steps are wanted
    task_cells: list[str] | None = None    # None: every cell (a round with tasks only)
    probe_cells: list[str] = field(default_factory=list)
    probes: int = 0              # new probes per cell of probe_cells
    probe_target: int = 0        # judged outputs per cell aimed for after the round
    scoring_cells: list[str] = field(default_factory=list)
    documents: int = 0           # new scoring documents per cell of scoring_cells
    document_target: int = 0     # scored sequences per cell aimed for after the round

    def __post_init__(self) -> None:
        if self.task_cells is None:
            self.task_cells = [] if self.docs == 0 else list(self.cells)

    @property
    def all_cells(self) -> list[str]:
        return [self.reference, *self.cells]


@dataclass
class RoundPlan:
    rounds: list[LengthRound] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)   # why a cell gets no round (budget, no baseline, ...)


def _open_task_reasons(verdict: Verdict, cell: str) -> int:
    """How many INCONCLUSIVE reasons the cell has when its task comparison is open; 0 otherwise."""
    if verdict.cells.get(cell) != INCONCLUSIVE:
        return 0
    if not any(c.cell == cell and c.name == "task_noninferiority" and c.passed is None for c in verdict.checks):
        return 0
    return sum(1 for r in verdict.reasons if r.cell == cell and r.level == INCONCLUSIVE)


def undecided_by_tasks(verdict: Verdict, cell: str) -> bool:
    """INCONCLUSIVE with one reason only, and that reason the task comparison still open."""
    return _open_task_reasons(verdict, cell) == 1


def task_decided(verdict: Verdict, cell: str) -> bool:
    """The cell's task comparison settled either way (shown non-inferior, or a significant drop)."""
    return any(c.cell == cell and c.name in ("task_noninferiority", "task_recovery") and c.passed is not None
               for c in verdict.checks)


def _task_evidence(evidence: schema.Evidence) -> schema.TaskEvidence | None:
    """The task evidence, None when no cell ran tasks (stored as {})."""
    return evidence.tasks if isinstance(evidence.tasks, schema.TaskEvidence) else None


def _yield(evidence: schema.Evidence, cell: str, n: int) -> float:
    """Paired samples per doc the cell was asked so far (rejections and errors cost docs)."""
    tasks = _task_evidence(evidence)
    rows = [r for r in (tasks.accuracy if tasks else []) if r.cell == cell and r.level == "cell"]
    asked = rows[0].samples if rows else None
    return min(1.0, max(0.2, n / asked)) if asked else 1.0


def _docs_to_steps(docs: int, shape: LengthShape) -> tuple[int, int | None]:
    """samples_per_point and a per-task limit that give about `docs` new docs at this length."""
    steps = max(1, math.ceil(docs / shape.docs_per_step))
    per_task = max(1, docs // max(1, shape.tasks))   # rounded down: a round never takes more than the budget left
    whole = steps * shape.docs_per_step // max(1, shape.tasks)
    return steps, (per_task if per_task < whole else None)


def _open(verdict: Verdict, cell: str, check: str) -> bool:
    return any(c.cell == cell and c.name == check and c.passed is None for c in verdict.checks)


def _reference_at(evidence: schema.Evidence, length: int) -> str | None:
    """The started baseline cell at this length (a quality reference included)."""
    for name, cell in evidence.cells.items():
        if cell.kv_spec == BASELINE_KV and cell.max_model_len == length and cell.started:
            return name
    return None


@dataclass
class _Want:
    """What one cell would sample next: new task docs (target, docs) and/or new probes (target, count)."""

    length: int
    reference: str
    task_target: int = 0
    docs: int = 0
    probe_target: int = 0
    probes: int = 0
    document_target: int = 0
    documents: int = 0


def _kv_comparison(evidence: schema.Evidence, cell: str) -> schema.Comparison | None:
    """The cell's divergence comparison with its own-length baseline (None: none, or another length's)."""
    for comp in evidence.divergence.comparisons if evidence.divergence else []:
        if comp.kind == "kv" and comp.cell == cell and comp.same_length is not False:
            return comp
    return None


def scored_sequence_count(comp: schema.Comparison) -> int:
    """Sequences the cell's divergence test rests on (its clusters)."""
    figure = (comp.clustered or {}).get("kl_mean")
    return figure.clusters if figure else len(comp.per_sequence)


def _scoring_want(cell: str, comp: schema.Comparison, notes: list[str]) -> tuple[int, int] | None:
    """(target sequences, new documents) of a scoring round for the cell: double the scored sequences,
    within the design's MAX_SCORED_SEQUENCES; None with a note when no useful round is left."""
    scored = scored_sequence_count(comp)
    if not scored:
        return None
    target = min(next_look_size(comp.looks or [scored], MAX_SCORED_SEQUENCES), MAX_SCORED_SEQUENCES)
    if target - scored < max(1, scored // 4):
        notes.append(f"{cell}: no scoring round: the design's {MAX_SCORED_SEQUENCES} scored sequences per cell are spent")
        return None
    return target, target - scored


def _divergence_leans_to_harm(verdict: Verdict, cell: str) -> bool:
    """A KL figure of the cell over its healthy budget (only a FAIL could come of more documents)."""
    return any(c.cell == cell and c.name in ("kl_mean", "kl_late_mean") and c.value is not None
               and c.limit is not None and c.value > c.limit for c in verdict.checks)


def _task_want(cell: str, entry: schema.TaskCell, evidence: schema.Evidence, budget: Budget, thresholds: Thresholds,
               shapes: dict[int, LengthShape], notes: list[str]) -> tuple[int, int] | None:
    """(target, docs) of a task round for the cell, or None with a note saying why not."""
    n, length = entry.n, entry.max_model_len
    if length not in shapes:
        notes.append(f"{cell}: no new task samples can be made at {length} (only kveval's own tasks "
                     "have generated data)")
        return None
    if n >= budget.samples:
        notes.append(f"{cell}: the budget of {budget.samples} paired samples per cell is spent")
        return None
    target = next_look_size(entry.looks or [n], budget.samples)
    if target - n < max(1, n // 4):
        # What the budget leaves would hardly move the bound: not worth another engine start.
        notes.append(f"{cell}: the budget of {budget.samples} paired samples per cell is spent "
                     f"(only {budget.samples - n} left)")
        return None
    return target, math.ceil((target - n) / _yield(evidence, cell, n))


def _probe_want(cell: str, entry: schema.DegenerationCell, budget: Budget, probes_left: int,
                notes: list[str]) -> tuple[int, int] | None:
    """(target, probes) of a probe round for the cell: double the judged outputs, within the budget's
    samples per cell and the probes left to draw; None with a note when neither allows a useful round."""
    judged = entry.judged_outputs or 0
    if not judged:
        return None
    # The doubling schedule, never a round of a handful (a run with few prompts): each round costs engine
    # starts. The pool of probes may cut a look short; the boundaries follow the actual looks.
    target = min(next_look_size(entry.looks or [judged], budget.samples, MIN_PROBE_ROUND), judged + probes_left)
    if target - judged < max(1, judged // 4):
        why = (f"the budget of {budget.samples} outputs per cell is spent"
               if budget.samples - judged < max(1, judged // 4) else "kveval's pool of new probes is spent")
        notes.append(f"{cell}: no probe round: {why}")
        return None
    return target, target - judged


_STREAM_WORD = {"tasks": "task", "probes": "probe", "scoring": "scoring"}


def plan_round(verdict: Verdict, evidence: schema.Evidence, budget: Budget, thresholds: Thresholds,
               shapes: dict[int, LengthShape], costs: Costs | None, seconds_used: float,
               probes_left: int | None = None, scoring: bool = False,
               closed: dict[str, set[str]] | None = None) -> RoundPlan:
    """The next round per length (shortest first), or none, with a note for every cell left out.
    `probes_left`: new degeneration probes still to draw (None: no probe rounds in this run);
    `scoring`: whether new documents may be scored (the scoring phase is in the run);
    `closed`: per stream ("tasks", "probes", "scoring"), cells whose last look an earlier run of this
    directory made final: that look spent all the alpha left, so the stream takes no more evidence."""
    closed = closed or {}
    plan = RoundPlan()
    tasks = _task_evidence(evidence)
    comparisons = tasks.cells if tasks else {}
    degeneration = evidence.degeneration.cells
    wants: dict[str, _Want] = {}
    for cell, status in verdict.cells.items():
        if status != INCONCLUSIVE:
            continue
        task_open = cell in comparisons and _open(verdict, cell, "task_noninferiority")
        probe_open = cell in degeneration and _open(verdict, cell, "degeneration_noninferiority")
        comp = _kv_comparison(evidence, cell) if scoring else None
        divergence_open = [r for r in verdict.reasons if r.cell == cell and r.level == INCONCLUSIVE
                           and r.code in DIVERGENCE_CODES]
        scoring_open = comp is not None and bool(divergence_open)
        for stream, is_open in (("tasks", task_open), ("probes", probe_open), ("scoring", scoring_open)):
            if is_open and cell in closed.get(stream, ()):
                plan.notes.append(f"{cell}: no {_STREAM_WORD[stream]} round: its last look was final in this run's earlier "
                                  "rounds (it spent the alpha left); new evidence needs a new run (--seed)")
        task_open = task_open and cell not in closed.get("tasks", ())
        probe_open = probe_open and cell not in closed.get("probes", ())
        scoring_open = scoring_open and cell not in closed.get("scoring", ())
        if not (task_open or probe_open or scoring_open):
            continue
        open_reasons = sum(1 for r in verdict.reasons if r.cell == cell and r.level == INCONCLUSIVE)
        task = _task_want(cell, comparisons[cell], evidence, budget, thresholds, shapes, plan.notes) if task_open else None
        probe = (_probe_want(cell, degeneration[cell], budget, probes_left, plan.notes)
                 if probe_open and probes_left is not None else None)
        documents = _scoring_want(cell, comp, plan.notes) if scoring_open else None
        # PASS is within reach only if every open reason is a stream sampled now; else only a FAIL is.
        can_pass = open_reasons == (task is not None) + (probe is not None) + (len(divergence_open) if documents else 0)
        if task is not None and not can_pass:
            recovery = comparisons[cell].recovery
            if recovery is None or recovery >= thresholds.task_recovery_min:
                plan.notes.append(f"{cell}: no task round: another count keeps it undecided, which task samples "
                                  f"cannot settle, and its recovery is not under {100 * thresholds.task_recovery_min:.1f} %")
                task = None
        if probe is not None and not can_pass:
            entry = degeneration[cell]
            if entry.new_degenerate <= (entry.baseline_only_degenerate or 0):
                plan.notes.append(f"{cell}: no probe round: another count keeps it undecided, which probes cannot "
                                  "settle, and its outputs do not degenerate more often than the baseline's")
                probe = None
        if documents is not None and not can_pass and not _divergence_leans_to_harm(verdict, cell):
            plan.notes.append(f"{cell}: no scoring round: another count keeps it undecided, which documents cannot "
                              "settle, and no KL figure of it is over its healthy budget")
            documents = None
        if task is None and probe is None and documents is None:
            continue
        comparison = comparisons.get(cell)
        length = (comparison or degeneration.get(cell) or comp).max_model_len
        reference = ((comparison.reference if comparison else None) or (comp.reference if comp else None)
                     or _reference_at(evidence, length))
        if reference is None:
            plan.notes.append(f"{cell}: no round: no started {BASELINE_KV} cell at {length} to pair with")
            continue
        want = _Want(length, reference)
        if task is not None:
            want.task_target, want.docs = task
        if probe is not None:
            want.probe_target, want.probes = probe
        if documents is not None:
            want.document_target, want.documents = documents
        wants[cell] = want
    left = None if budget.seconds is None else budget.seconds - seconds_used
    for length in sorted({w.length for w in wants.values()}):
        group = {cell: w for cell, w in wants.items() if w.length == length}
        reference = next(iter(group.values())).reference
        docs = max(w.docs for w in group.values())
        probes = max(w.probes for w in group.values())
        documents = max(w.documents for w in group.values())
        if left is not None and costs is not None:
            per_probe = costs.seconds_per_probe if costs.seconds_per_probe is not None else costs.seconds_per_doc
            per_document = costs.seconds_per_document if costs.seconds_per_document is not None else costs.seconds_per_doc
            per_cell = left / (len(group) + 1) - costs.startup_seconds
            work = docs * costs.seconds_per_doc + probes * per_probe + documents * per_document
            if work > 0 and per_cell < work:
                share = max(0.0, per_cell) / work   # cut every stream alike to the time left
                docs, probes, documents = int(docs * share), int(probes * share), int(documents * share)
                if docs < min(max(w.docs for w in group.values()), shapes.get(length, LengthShape(1, 1)).tasks):
                    docs = 0
                if probes < 10:   # a handful of probes would hardly move the bound
                    probes = 0
                if documents < 4:   # nor would a handful of documents
                    documents = 0
                if not docs and not probes and not documents:
                    plan.notes.append(f"{', '.join(group)}: the budget's round time is spent "
                                      f"({seconds_used / 60:.0f} of {budget.seconds / 60:.0f} min)")
                    continue
            left -= (len(group) + 1) * (costs.startup_seconds + docs * costs.seconds_per_doc + probes * per_probe
                                        + documents * per_document)
        task_cells = [c for c, w in group.items() if w.docs and docs]
        probe_cells = [c for c, w in group.items() if w.probes and probes]
        scoring_cells = [c for c, w in group.items() if w.documents and documents]
        steps, limit = _docs_to_steps(docs, shapes[length]) if docs else (1, None)
        plan.rounds.append(LengthRound(length, reference,
                                       [c for c in group if c in task_cells or c in probe_cells or c in scoring_cells],
                                       max((w.task_target for c, w in group.items() if c in task_cells), default=0),
                                       docs, steps, limit, task_cells=task_cells, probe_cells=probe_cells,
                                       probes=probes,
                                       probe_target=max((w.probe_target for c, w in group.items() if c in probe_cells),
                                                        default=0),
                                       scoring_cells=scoring_cells, documents=documents,
                                       document_target=max((w.document_target for c, w in group.items()
                                                            if c in scoring_cells), default=0)))
    return plan
