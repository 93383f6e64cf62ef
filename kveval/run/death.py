"""Why a cell process ended without finishing, in plain words (pure: exit code, settings and log text in).

A negative exit code is the signal that ended the process (Popen's convention); 128 + N is a
shell's or a container runtime's way of saying the same. SIGKILL that kveval did not send is almost
always the kernel's OOM killer: the message then names the memory the cell had reserved and what
to lower. SIGSEGV/SIGABRT point at a crash inside native code (the log tail shows where).
"""
from __future__ import annotations

import signal
from dataclasses import dataclass

from kveval.files import schema

# Log texts of a Python-level out-of-memory inside the child (torch or the allocator said so).
_MEMORY_TEXTS = ("MemoryError", "out of memory", "Cannot allocate memory", "std::bad_alloc")


def signal_of(exit_code: int | None) -> int | None:
    if exit_code is None:
        return None
    if exit_code < 0:
        return -exit_code
    if 128 < exit_code < 128 + 65:
        return exit_code - 128
    return None


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


@dataclass(frozen=True)
class Death:
    """Why a cell's process ended before it finished, as its cell file's `crash` (and `process.cause`) say it."""

    cause: str     # stalled, timeout, interrupted, oom_killed, out_of_memory, native_crash, signal, exit
    message: str
    advice: str


def explain_death(exit_code: int | None, *, timed_out: bool, timeout_s: float | None, stopped_by_user: bool,
                  kv_cache_memory_bytes: int | None, log_tail: str, stalled: schema.Stalled | None = None) -> Death:
    """Why the cell process died: cause is one of stalled, timeout, interrupted, oom_killed, out_of_memory,
    native_crash, signal, exit. `stalled`: what `cell_process` saw last before it stopped a cell that
    made no progress (phase, seconds, done, total, item)."""
    number = signal_of(exit_code)
    reserved = (f"; its KV cache alone had {kv_cache_memory_bytes / 2 ** 20:,.0f} MiB reserved"
                if kv_cache_memory_bytes else "")
    if stalled is not None:
        step = f" after step {stalled.done} of {stalled.total}" if stalled.total else ""
        item = f" (last: {stalled.item})" if stalled.item else ""
        return Death(cause="stalled",
                message=f"the engine stopped making progress: no step of its {stalled.phase} phase finished "
                           f"for {stalled.seconds} s{step}{item}, so kveval stopped the cell",
                advice="an engine that hangs on a configuration is a defect of that engine path (vLLM), not a "
                          "measure of FP8 quality; see the cell's log, try another vLLM version or attention "
                          "backend, or raise --stall-timeout if one step really takes that long")
    if timed_out:
        return Death(cause="timeout",
                message=f"kveval stopped the cell after its timeout of {timeout_s:.0f} s",
                advice="raise --cell-timeout if the cell was still making progress (its log shows how far it got)")
    if stopped_by_user:
        return Death(cause="interrupted", message="the run was interrupted (Ctrl-C or SIGTERM) while this cell ran",
                advice="re-run the same command into the same --out to redo it; finished cells are kept")
    if any(text in log_tail for text in _MEMORY_TEXTS):
        return Death(cause="out_of_memory",
                message=f"the cell process ran out of memory (exit code {exit_code}){reserved}",
                advice="lower --kv-cache-memory or the largest --max-model-len, or free memory on this machine")
    if number == signal.SIGKILL:
        return Death(cause="oom_killed",
                message=f"the cell process was killed by SIGKILL (exit code {exit_code}), which kveval did not "
                           f"send: almost always the kernel's out-of-memory killer{reserved}",
                advice="check `dmesg` or the container's memory events; lower --kv-cache-memory or the largest "
                          "--max-model-len, or free memory, then re-run the same command to redo this cell")
    if number in (signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS, signal.SIGILL):
        return Death(cause="native_crash",
                message=f"the cell process crashed with {signal_name(number)} (exit code {exit_code}) inside "
                           "native code (vLLM, torch or a kernel)",
                advice="the log tail below shows the last step; re-running redoes this cell")
    if number is not None:
        return Death(cause="signal", message=f"the cell process was ended by {signal_name(number)} "
                                              f"(exit code {exit_code})",
                advice="something outside kveval stopped it; re-running redoes this cell")
    return Death(cause="exit", message=f"the cell process exited with code {exit_code} before finishing",
            advice="the log tail below shows why; re-running redoes this cell")


def log_tail(log: str, lines: int = 12, width: int = 400) -> str:
    """The last non-empty lines of a cell log, each cut to `width` characters."""
    kept = [line[-width:] for line in log.strip().splitlines() if line.strip()]
    return "\n".join(kept[-lines:])
