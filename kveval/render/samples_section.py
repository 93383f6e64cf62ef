"""The review's sample outputs section: the first short prompt's answer in every started cell.
Pure: evidence in, markdown out.
"""
from __future__ import annotations

import re

import pandas as pd

from kveval.files import schema
from kveval.render.markdown import escape_name, shorten, table


def samples_section(evidence: schema.Evidence) -> str:
    """The first short prompt's answer in every started cell, escaped, so a reader sees the text."""
    samples = evidence.sample_outputs
    rows = [{"cell": row.cell, "tokens": row.tokens, "finish": row.finish,
             "output (start)": shorten(row.text or "", 240)} for row in (samples.rows if samples else [])]
    if not rows:
        return ""
    name = samples.prompt
    # A plain id reads best as code; anything else is escaped text (a code span cannot be escaped).
    shown = f"`{name}`" if re.fullmatch(r"[\w.:\-]+", str(name)) else escape_name(name)
    return "\n".join([f"## Sample outputs — {shown}", "",
                      table(pd.DataFrame(rows), untrusted=("output (start)",))])
