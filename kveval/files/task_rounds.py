"""A cell's task samples pooled over rounds: the first tasks phase plus every later round's (run/rounds.py).

A round runs the tasks phase alone, in its own cell process, on new samples; its result is stored
beside the cell as cells/<cell>.tasks-r<k>.json (a cell record of its own). Readers see one cell:
its tasks phase holds the samples of every round, each tagged with its round (0: the first), so the
paired comparison pools them (pairing is by task and sample id, and round ids never collide) and the
gate can tell the looks apart.
"""
from __future__ import annotations

import copy


def round_cell_id(cell: str, round_number: int) -> str:
    """The id (and file stem) of a cell's k-th task round."""
    return f"{cell}.tasks-r{round_number}"


def rounds_of(manifest: dict | None, cell: str) -> list[int]:
    """The rounds the manifest planned for `cell`, in order."""
    rounds = ((manifest or {}).get("task_rounds") or {}).get("rounds") or []
    return [int(r["round"]) for r in rounds if cell in (r.get("cells") or [])]


def design_of(manifest: dict | None, cell: str) -> dict | None:
    """The sequential design as it applies to `cell`: n_max (the budget's paired samples per cell) and
    final (its last look spends the alpha left); None for runs without rounds or with --budget 0."""
    rounds = (manifest or {}).get("task_rounds") or {}
    if not rounds.get("n_max"):
        return None
    return {"n_max": int(rounds["n_max"]), "final": cell in (rounds.get("final") or []), "stopped": rounds.get("stopped")}


def merge_rounds(facts: dict, rounds: list[tuple[int, dict | None]], design: dict | None = None) -> dict:
    """`facts` with the task samples of every round appended and the design noted (a copy; facts
    without a tasks phase, or with neither, come back as they are). A round that did not start, crashed
    or failed adds no sample; it is listed under the phase's `rounds` with what happened, never as the
    phase's own error (the first round's samples still stand)."""
    phase = (facts.get("phases") or {}).get("tasks")
    if not (rounds or design) or not isinstance(phase, dict) or phase.get("error"):
        return facts
    merged = copy.deepcopy(facts)
    tasks = merged["phases"]["tasks"]
    if design:
        tasks["design"] = dict(design)
    if not rounds:
        return merged
    tasks["samples"] = [{**sample, "round": 0} for sample in tasks.get("samples") or []]
    tasks["rounds"] = []
    for number, record in rounds:
        extra = ((record or {}).get("phases") or {}).get("tasks") or {}
        samples = [{**sample, "round": number} for sample in extra.get("samples") or []]
        tasks["samples"] += samples
        if extra.get("seconds"):
            tasks["seconds"] = (tasks.get("seconds") or 0.0) + extra["seconds"]
        tasks["rounds"].append({
            "round": number, "samples": len(samples), "started": bool((record or {}).get("started")),
            "error": extra.get("error") or ((record or {}).get("crash") or {}).get("message")
                     or ((record or {}).get("failure") or {}).get("message")
                     or (None if record else "no result file"),
            "task_errors": dict(extra.get("task_errors") or {}),
            "seconds": ((record or {}).get("process") or {}).get("seconds")})
    return merged
