"""The review's sample outputs section: the first short prompt's answer in every started cell.
Pure: evidence in, markdown out.
"""
from __future__ import annotations

import re

import pandas as pd

from kveval.render.markdown import escape_name, shorten, table


def samples_section(evidence: dict) -> str:
    """The first short prompt's answer in every started cell, escaped, so a reader sees the text."""
    samples = evidence.get("sample_outputs") or {}
    rows = [{"cell": row["cell"], "tokens": row.get("tokens"), "finish": row.get("finish"),
             "output (start)": shorten(row.get("text") or "", 240)} for row in samples.get("rows") or []]
    if not rows:
        return ""
    name = samples["prompt"]
    # A plain id reads best as code; anything else is escaped text (a code span cannot be escaped).
    shown = f"`{name}`" if re.fullmatch(r"[\w.:\-]+", str(name)) else escape_name(name)
    return "\n".join([f"## Sample outputs — {shown}", "",
                      table(pd.DataFrame(rows), untrusted=("output (start)",))])
