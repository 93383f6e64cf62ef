"""Which prompts each started cell accepted, as vLLM decided (never predicted)."""
from __future__ import annotations

import pandas as pd

from kveval.analysis.cell_records import generation_records


def acceptance_matrix(workloads: list[dict], cells: dict[str, dict]) -> pd.DataFrame:
    """Rows: prompts; columns: cells; values: accepted / rejected / error / not run."""
    rows = []
    for prompt in workloads:
        row = {"prompt": prompt["id"], "prompt_tokens": len(prompt["token_ids"])}
        for name, facts in cells.items():
            if not facts.get("started"):
                row[name] = "not started"
                continue
            record = generation_records(facts).get(prompt["id"])
            if record is None:
                row[name] = "not run"
            elif record.get("accepted"):
                row[name] = "accepted"
            elif record.get("rejection"):
                row[name] = "rejected"
            else:
                row[name] = "error"
        rows.append(row)
    return pd.DataFrame(rows)


def rejections(cells: dict[str, dict]) -> pd.DataFrame:
    """Every refused or failed prompt with the engine's own message."""
    rows = []
    for name, facts in cells.items():
        for record in generation_records(facts).values():
            if not record.get("accepted"):
                rows.append({"cell": name, "prompt": record["prompt_id"],
                             "kind": "rejected" if record.get("rejection") else "error",
                             "message": record.get("rejection") or record.get("error")})
    return pd.DataFrame(rows, columns=["cell", "prompt", "kind", "message"])
