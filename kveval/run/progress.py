"""What the user sees while cells run: one line per phase change, a live status with counts."""
from __future__ import annotations

import time

from rich.console import Console
from rich.markup import escape

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

    def cell_event(self, cell: str, event: dict) -> None:
        elapsed = time.monotonic() - self._began.get(cell, time.monotonic())
        kind = event.get("event")
        if kind == "phase":
            phase = event.get("phase", "")
            self._phase[cell] = phase
            if phase != "done":
                self.console.print(f"  {cell}: {_PHASE_LABELS.get(phase, phase)}  [dim]({elapsed:.0f} s)[/]")
            self._set_status(f"{cell}: {_PHASE_LABELS.get(phase, phase)}")
        elif kind == "outcome":
            if event.get("started"):
                pool = event.get("kv_pool_tokens")
                self.console.print(f"  {cell}: engine up, KV pool {pool:,} tokens" if pool else f"  {cell}: engine up")
            else:
                self.console.print(f"  {cell}: [red]did not start[/] ({escape(str(event.get('reason')))})")
        elif kind == "step":
            label = _PHASE_LABELS.get(event.get("phase", ""), event.get("phase", ""))
            item = f" {escape(str(event['item']))}" if event.get("item") else ""
            self._set_status(f"{cell}: {label} {event.get('done')}/{event.get('total')}{item}  ({elapsed:.0f} s)")

    def cell_finished(self, cell: str, facts: dict) -> None:
        self._stop_status()
        elapsed = time.monotonic() - self._began.get(cell, time.monotonic())
        self.console.print(f"[bold]{cell}[/]: {summarise_cell(facts)}  [dim]({elapsed:.0f} s)[/]")

    def cell_reused(self, cell: str, facts: dict) -> None:
        self.console.print(f"[bold]{cell}[/]: reused from the run directory — {summarise_cell(facts)}")


def summarise_cell(facts: dict) -> str:
    if not facts.get("started"):
        failure = facts.get("failure") or {}
        # vLLM's words may contain "[...]" (paths, errno): escape them so rich does not read markup.
        return f"[red]failed to start[/]: {failure.get('reason', '?')} — {escape(str(failure.get('message', ''))[:160])}"
    parts = ["[green]started[/]"]
    pool = (facts.get("capacity") or {}).get("kv_pool_tokens")
    if pool:
        parts.append(f"KV pool {pool:,} tokens")
    records = (facts.get("phases", {}).get("generation") or {}).get("records", [])
    if records:
        accepted = sum(1 for r in records if r.get("accepted"))
        parts.append(f"{accepted}/{len(records)} prompts accepted")
    errors = [name for name, phase in facts.get("phases", {}).items() if phase.get("error")]
    if errors:
        parts.append(f"[red]phase errors: {', '.join(errors)}[/]")
    if facts.get("crash"):
        parts.append(f"[red]crashed: {escape(str(facts['crash']['message']))}[/]")
    return ", ".join(parts)
