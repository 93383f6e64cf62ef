"""The errors a user sees: one clean message each, never a traceback."""
from __future__ import annotations

from pathlib import Path


class KvevalError(Exception):
    """A user-facing error: the CLI prints the message, never a traceback."""


class RunInterrupted(KvevalError):
    """Ctrl-C or SIGTERM during a run: finished cells are kept and a partial review is written."""

    def __init__(self, run_dir: Path):
        self.run_dir = run_dir
        super().__init__(f"interrupted; finished cells are kept in {run_dir} (partial review: {run_dir / 'review.md'}). "
                         "Run the same command again to resume.")
