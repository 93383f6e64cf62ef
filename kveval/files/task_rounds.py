"""A cell's evidence pooled over rounds: the first tasks and generation phases plus every later round's
(run/rounds.py).

A round runs the tasks phase on new samples and/or the generation phase on new degeneration probes, in
its own cell process; its result is stored beside the cell as cells/<cell>.tasks-r<k>.json (a cell record
of its own). Readers see one cell: its tasks phase holds the samples of every round and its generation
phase the outputs of every round, each tagged with its round (0: the first), so the paired comparisons
pool them (pairing is by sample or prompt id, and round ids never collide) and the gate can tell the
looks apart.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass


def round_cell_id(cell: str, round_number: int) -> str:
    """The id (and file stem) of a cell's k-th task round."""
    return f"{cell}.tasks-r{round_number}"


def rounds_of(manifest: dict | None, cell: str) -> list[int]:
    """The rounds the manifest planned for `cell`, in order."""
    rounds = ((manifest or {}).get("task_rounds") or {}).get("rounds") or []
    return [int(r["round"]) for r in rounds if cell in (r.get("cells") or [])]


@dataclass(frozen=True)
class RoundStreams:
    """Of a cell's rounds, those that sampled tasks and those that generated degeneration probes."""

    tasks: list[int]
    probes: list[int]


def streams_of(manifest: dict | None, cell: str) -> RoundStreams:
    """Which of `cell`'s rounds ran tasks and which probes; a round from before probe rounds (no
    task_cells list) ran tasks for all its cells."""
    rounds = ((manifest or {}).get("task_rounds") or {}).get("rounds") or []
    tasks, probes = [], []
    for entry in rounds:
        if cell not in (entry.get("cells") or []):
            continue
        task_cells = entry.get("task_cells")
        if task_cells is None or cell in task_cells:
            tasks.append(int(entry["round"]))
        if cell in (entry.get("probe_cells") or []):
            probes.append(int(entry["round"]))
    return RoundStreams(tasks, probes)


def design_of(manifest: dict | None, cell: str) -> dict | None:
    """The sequential design as it applies to `cell`: n_max (the budget's paired samples per cell, task
    samples and probe outputs alike), final (its last task look spends the alpha left) and
    final_degeneration (the same for its degeneration comparison); None for runs without rounds or with
    --budget 0."""
    rounds = (manifest or {}).get("task_rounds") or {}
    if not rounds.get("n_max"):
        return None
    return {"n_max": int(rounds["n_max"]), "final": cell in (rounds.get("final") or []),
            "final_degeneration": cell in (rounds.get("final_degeneration") or []), "stopped": rounds.get("stopped")}


def _round_failure(record: dict | None, phase: dict) -> str | None:
    return (phase.get("error") or ((record or {}).get("crash") or {}).get("message")
            or ((record or {}).get("failure") or {}).get("message") or (None if record else "no result file"))


def _merge_generation(merged: dict, rounds: list[tuple[int, dict | None]], design: dict | None) -> None:
    """Append every round's probe outputs to the cell's generation phase (tagged with the round)."""
    phase = (merged.get("phases") or {}).get("generation")
    if not isinstance(phase, dict) or phase.get("error"):
        return
    if design:
        phase["design"] = {"n_max": design["n_max"], "final": bool(design.get("final_degeneration"))}
    if not rounds:
        return
    phase["records"] = [{**record, "round": record.get("round", 0)} for record in phase.get("records") or []]
    phase["rounds"] = []
    for number, record in rounds:
        extra = ((record or {}).get("phases") or {}).get("generation") or {}
        added = [{**out, "round": number} for out in extra.get("records") or []]
        phase["records"] += added
        phase["rounds"].append({"round": number, "outputs": len(added), "started": bool((record or {}).get("started")),
                                "error": _round_failure(record, extra)})


def merge_rounds(facts: dict, rounds: list[tuple[int, dict | None]], design: dict | None = None,
                 streams: RoundStreams | None = None) -> dict:
    """`facts` with the task samples and probe outputs of every round appended and the design noted (a
    copy; facts with neither rounds nor a design come back as they are). `rounds`: the cell's rounds with
    their records; `streams`: which of them sampled tasks and which probes (None: all tasks, as before
    probe rounds existed). A round that did not start, crashed or failed adds nothing; it is listed under
    the phase's `rounds` with what happened, never as the phase's own error (the first round's samples
    still stand)."""
    if not (rounds or design):
        return facts
    streams = streams or RoundStreams([n for n, _ in rounds], [])
    merged = copy.deepcopy(facts)
    _merge_generation(merged, [(n, r) for n, r in rounds if n in streams.probes], design)
    tasks = (merged.get("phases") or {}).get("tasks")
    if not isinstance(tasks, dict) or tasks.get("error"):
        return merged
    if design:
        tasks["design"] = {k: v for k, v in design.items() if k != "final_degeneration"}
    task_rounds = [(n, r) for n, r in rounds if n in streams.tasks]
    if not task_rounds:
        return merged
    tasks["samples"] = [{**sample, "round": 0} for sample in tasks.get("samples") or []]
    tasks["rounds"] = []
    for number, record in task_rounds:
        extra = ((record or {}).get("phases") or {}).get("tasks") or {}
        samples = [{**sample, "round": number} for sample in extra.get("samples") or []]
        tasks["samples"] += samples
        if extra.get("seconds"):
            tasks["seconds"] = (tasks.get("seconds") or 0.0) + extra["seconds"]
        tasks["rounds"].append({
            "round": number, "samples": len(samples), "started": bool((record or {}).get("started")),
            "error": _round_failure(record, extra),
            "task_errors": dict(extra.get("task_errors") or {}),
            "seconds": ((record or {}).get("process") or {}).get("seconds")})
    return merged
