"""Markdown helpers: tables from DataFrames, and escaping so model output cannot break a table."""
from __future__ import annotations

import math

import pandas as pd

from kveval.files import schema

_ESCAPES = {"|": "\\|", "`": "\\`", "<": "&lt;", ">": "&gt;", "*": "\\*", "_": "\\_", "[": "\\[", "]": "\\]",
            "#": "\\#"}


def escape_name(text: object, limit: int | None = 120) -> str:
    """A user-given name (a prompt id from --prompts): escaped like model output, except that `_` and
    `#` stay (inside a word they are not markup), so ids such as short_64-0 read as they are."""
    return escape_cell(text, limit).replace("\\_", "_").replace("\\#", "#")


def escape_cell(text: object, limit: int | None = 200) -> str:
    """One table cell of untrusted text: single line, escaped, shortened."""
    if text is None or (isinstance(text, float) and math.isnan(text)):
        return ""
    value = str(text).replace("\r\n", "\n").replace("\r", "\n")
    value = value.replace("\n", " ⏎ ").replace("\t", " ")
    value = "".join(ch if ch.isprintable() else f"\\x{ord(ch):02x}" for ch in value)
    if limit is not None and len(value) > limit:
        value = value[: limit - 1] + "…"
    return "".join(_ESCAPES.get(ch, ch) for ch in value)


def fmt_int(value) -> str:
    return "" if value is None or pd.isna(value) else f"{int(value):,}"


def fmt_float(value, digits: int = 2) -> str:
    return "" if value is None or pd.isna(value) else f"{value:,.{digits}f}"


def fmt_sig(value, digits: int = 3) -> str:
    """Small statistics (KL in nats, probabilities): significant digits, e.g. 0.00341, 0.41, 4.3."""
    if value is None or pd.isna(value):
        return ""
    if value == 0:
        return "0"
    if abs(value) >= 10 ** digits:
        return f"{value:,.0f}"
    return f"{value:.{digits}g}" if abs(value) >= 1e-4 else f"{value:.{max(digits - 1, 0)}e}"


def fmt_share(value, digits: int = 1) -> str:
    """A share in [0, 1] as a percentage: 0.969 -> 96.9 %."""
    return "" if value is None or pd.isna(value) else f"{100 * value:.{digits}f} %"


def fmt_pct(value, digits: int = 1) -> str:
    return "" if value is None or pd.isna(value) else f"{value:+.{digits}f} %"


def _plain(value) -> str:
    """Our own labels: keep markdown (bold, code) but never let a value break the table row."""
    return str(value).replace("|", "\\|").replace("\n", " ")


def rows_frame(rows, columns: list[str] | None = None) -> pd.DataFrame:
    """A pandas table of typed evidence rows (schema models), one column per key as results.json
    stores them (a key an older kveval did not write is no column, as in the stored file)."""
    return pd.DataFrame([schema.dump(row) for row in rows or []], columns=columns)


def table(frame: pd.DataFrame, untrusted: tuple[str, ...] = (), names: tuple[str, ...] = ()) -> str:
    """A GitHub-flavoured pipe table. Columns named in `untrusted` (model output, engine messages)
    are fully escaped, those in `names` (user-given ids) as escape_name does; everything else is
    treated as kveval's own text."""
    if frame.empty:
        return "_(nothing to show)_"
    safe = frame.copy()
    for column in safe.columns:
        escape = (escape_cell if column in untrusted else escape_name if column in names
                  else (lambda v, limit=None: _plain(v)))
        safe[column] = safe[column].map(
            lambda v, escape=escape: "" if v is None or (isinstance(v, float) and math.isnan(v)) else escape(v, limit=None)
        )
    safe.columns = [_plain(c) for c in safe.columns]
    return safe.to_markdown(index=False, disable_numparse=True)


# The one threshold for every long table of the review: a table of more rows folds into a <details>
# block, so the sections stay short to scroll past and the figures are one click away.
MAX_OPEN_ROWS = 12


def folded(text: str, rows: int, summary: str) -> str:
    """`text` (a table of `rows` rows) as it is, or past MAX_OPEN_ROWS rows inside a <details> block
    whose <summary> is `summary` (kveval's own words). The blank line after the summary is what makes
    GitHub render the markdown table inside the block."""
    if rows <= MAX_OPEN_ROWS:
        return text
    return f"<details><summary>{summary}</summary>\n\n{text}\n\n</details>"


def long_table(frame: pd.DataFrame, summary: str, untrusted: tuple[str, ...] = (), names: tuple[str, ...] = ()) -> str:
    """`table`, folded (see `folded`) when the frame has more than MAX_OPEN_ROWS rows."""
    return folded(table(frame, untrusted=untrusted, names=names), len(frame), summary)


def bullet(text: str) -> str:
    """A verdict reason: kveval's own sentence (cell names are validated dtype names), one line."""
    return "- " + " ".join(str(text).split())


def shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
