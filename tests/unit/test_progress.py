"""The progress display prints vLLM's words verbatim, even when they look like rich markup."""
from __future__ import annotations

import io

from rich.console import Console

from kveval.files import schema
from kveval.run.cell_process import CellEvent
from kveval.run.progress import ConsoleProgress
from tests.support.constructed import complete_cell


def _cell(**facts) -> schema.CellResult:
    """A stored cell record with these parts (the rest filled in), typed as compare hands it to the display."""
    if "failure" in facts:
        facts["failure"] = {"estimated_max_model_len": None, "backend": None, **facts["failure"]}
    if "crash" in facts:
        facts["crash"] = {"last_log_line": "", **facts["crash"]}
    return schema.parse(schema.CellResult, complete_cell(facts), "cell")


def test_engine_messages_with_brackets_are_printed_not_parsed():
    buffer = io.StringIO()
    progress = ConsoleProgress(Console(file=buffer, width=200, force_terminal=False))
    message = "OSError: [Errno 2] No such file [/tmp/a] [bold]x"
    progress.note("Run directory: runs/[x]")
    progress.cell_started("fp8-1024")
    progress.cell_event("fp8-1024", CellEvent(event="outcome", started=False, reason="other"))
    progress.cell_finished("fp8-1024", _cell(started=False, failure={"reason": "other", "message": message}))
    progress.cell_finished("auto-1024", _cell(started=True, capacity={"kv_pool_tokens": 1792}, phases={},
                                              crash={"message": "exited [/x]"}))
    text = buffer.getvalue()
    assert message in text and "Run directory: runs/[x]" in text and "exited [/x]" in text


def test_where_a_cell_runs_is_said_and_its_time_is_counted_from_its_start(monkeypatch):
    import kveval.run.progress as progress_module

    now = [100.0]
    monkeypatch.setattr(progress_module.time, "monotonic", lambda: now[0])
    buffer = io.StringIO()
    progress = ConsoleProgress(Console(file=buffer, width=200, force_terminal=False))
    progress.cell_started("fp8-1024", "GPU 1")
    now[0] = 112.4
    progress.cell_event("fp8-1024", CellEvent(event="phase", phase="generation"))
    now[0] = 130.0
    progress.cell_finished("fp8-1024", _cell(started=True, capacity={"kv_pool_tokens": 1792}, phases={}))
    text = buffer.getvalue()
    assert "fp8-1024 (GPU 1): cell process started" in text
    assert "(12 s)" in text and "(30 s)" in text and "-0 s" not in text
