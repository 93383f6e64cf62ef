"""What the user sees while cells run: one line per phase change, a live status with counts."""
from __future__ import annotations

import time

from rich.console import Console
from rich.markup import escape

from kveval.files import schema
from kveval.run.cell_process import CellEvent

_PHASE_LABELS = {"engine_start": "starting engine", "generation": "greedy generation", "speed": "speed runs", "scoring": "teacher-forced scoring",
                 "done": "done"}


class ConsoleProgress:
    """Prints progress to stderr (stdout stays clean for the review path)."""

    def __init__(self, console: Console | None = None):
        # soft_wrap: long lines stay whole in CI logs (greppable) instead of being cut at 80 columns.
        self.console = console or Console(stderr=True, highlight=False, soft_wrap=True)
        self._status = None
        self._began: dict[str, float] = {}
        self._phase: dict[str, str] = {}

    def note(self, message: str) -> None:
        self.console.print(escape(message))

    def _set_status(self, text: str) -> None:
        if not self.console.is_terminal:
            return
        if self._status is None:
            self._status = self.console.status(text)
            self._status.start()
        else:
            self._status.update(text)

    def _stop_status(self) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None

    def cell_started(self, cell: str, where: str | None = None) -> None:
        """`where`: the device or executor it runs on (GPU 0, Ray task), said once, not part of its name."""
        self._began[cell] = time.monotonic()
        self.console.print(f"[bold]{cell}[/]{f' ({escape(where)})' if where else ''}: cell process started")
        self._set_status(f"{cell}: starting")

    def cell_event(self, cell: str, event: CellEvent) -> None:
        elapsed = time.monotonic() - self._began.get(cell, time.monotonic())
        kind = event.event
        if kind == "phase":
            phase = event.phase or ""
            self._phase[cell] = phase
            if phase != "done":
                self.console.print(f"  {cell}: {_PHASE_LABELS.get(phase, phase)}  [dim]({elapsed:.0f} s)[/]")
            self._set_status(f"{cell}: {_PHASE_LABELS.get(phase, phase)}")
        elif kind == "outcome":
            if event.started:
                pool = event.kv_pool_tokens
                self.console.print(f"  {cell}: engine up, KV pool {pool:,} tokens" if pool else f"  {cell}: engine up")
            else:
                self.console.print(f"  {cell}: [red]did not start[/] ({escape(str(event.reason))})")
        elif kind == "step":
            label = _PHASE_LABELS.get(event.phase or "", event.phase or "")
            item = f" {escape(str(event.item))}" if event.item else ""
            self._set_status(f"{cell}: {label} {event.done}/{event.total}{item}  ({elapsed:.0f} s)")

    def cell_finished(self, cell: str, facts: schema.CellResult) -> None:
        self._stop_status()
        elapsed = time.monotonic() - self._began.get(cell, time.monotonic())
        self.console.print(f"[bold]{cell}[/]: {summarise_cell(facts)}  [dim]({elapsed:.0f} s)[/]")

    def cell_reused(self, cell: str, facts: schema.CellResult) -> None:
        self.console.print(f"[bold]{cell}[/]: reused from the run directory — {summarise_cell(facts)}")


def summarise_cell(facts: schema.CellResult) -> str:
    if not facts.started:
        failure = facts.failure
        # vLLM's words may contain "[...]" (paths, errno): escape them so rich does not read markup.
        reason, message = (failure.reason, failure.message) if failure is not None else ("?", "")
        return f"[red]failed to start[/]: {reason} — {escape(message[:160])}"
    parts = ["[green]started[/]"]
    pool = facts.capacity.kv_pool_tokens if facts.capacity is not None else None
    if pool:
        parts.append(f"KV pool {pool:,} tokens")
    generation = facts.phases.generation
    records = (generation.records if generation is not None else None) or []
    if records:
        accepted = sum(1 for r in records if r.accepted)
        parts.append(f"{accepted}/{len(records)} prompts accepted")
    errors = [name for name in schema.Phases.model_fields
              if getattr(facts.phases, name) is not None and getattr(facts.phases, name).error]
    if errors:
        parts.append(f"[red]phase errors: {', '.join(errors)}[/]")
    if facts.crash is not None:
        parts.append(f"[red]crashed: {escape(facts.crash.message)}[/]")
    return ", ".join(parts)
