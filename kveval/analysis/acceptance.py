"""Which prompts each started cell accepted, as vLLM decided (never predicted)."""
from __future__ import annotations

from typing import Any

import pandas as pd

from kveval.analysis.cell_records import generation_records, prompts_of
from kveval.files.schema import CellResult


def acceptance_matrix(workloads: list[dict[str, Any]], cells: dict[str, CellResult]) -> pd.DataFrame:
    """Rows: prompts; columns: cells; values: accepted / rejected / error / not run. The degeneration
    probes share one row ("probe (100 prompts)": "accepted", or "k/n accepted"), so a hundred short
    questions do not bury the prompts whose acceptance is the finding. Probe rounds give new probes only
    to the cells still undecided (and their baseline), so a cell decided earlier ran fewer of the row's
    probes: its value counts the probes it ran and says how many ("accepted (20 of 142 run)"), never
    "20/142 accepted", which would read as 122 refusals."""
    rows = []
    prompts = prompts_of(workloads)
    probes = [prompt for prompt in prompts if prompt.kind == "probe"]
    for prompt in prompts:
        if prompt.kind == "probe":
            continue
        rows.append({"prompt": prompt.id, "prompt_tokens": prompt.tokens,
                     **{name: _status(facts, prompt.id) for name, facts in cells.items()}})
    if probes:
        row: dict[str, Any] = {"prompt": f"{probes[0].workload or 'probe'} ({len(probes)} prompts)",
                               "prompt_tokens": max(prompt.tokens or 0 for prompt in probes)}
        for name, facts in cells.items():
            statuses = [_status(facts, prompt.id) for prompt in probes]
            ran = [status for status in statuses if status != "not run"] or statuses
            accepted = ran.count("accepted")
            value = ran[0] if len(set(ran)) == 1 else f"{accepted}/{len(ran)} accepted"
            row[name] = value if len(ran) == len(statuses) else f"{value} ({len(ran)} of {len(statuses)} run)"
        rows.append(row)
    return pd.DataFrame(rows)


def _status(facts: CellResult, prompt_id: str) -> str:
    if not facts.started:
        return "not started"
    record = generation_records(facts).get(prompt_id)
    if record is None:
        return "not run"
    if record.accepted:
        return "accepted"
    return "rejected" if record.rejection else "error"


def rejections(cells: dict[str, CellResult]) -> pd.DataFrame:
    """Every refused or failed prompt with the engine's own message."""
    rows = []
    for name, facts in cells.items():
        for record in generation_records(facts).values():
            if not record.accepted:
                rows.append({"cell": name, "prompt": record.prompt_id,
                             "kind": "rejected" if record.rejection else "error",
                             "message": record.rejection or record.error})
    return pd.DataFrame(rows, columns=["cell", "prompt", "kind", "message"])
