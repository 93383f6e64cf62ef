"""Resuming into the same --out: which stored cells are kept, which are measured again, and whether
the run found there is this one (its settings fingerprint) or another, which is never overwritten."""
from __future__ import annotations

import datetime as _dt

from kveval.errors import KvevalError
from kveval.files import schema
from kveval.files.run_lock import LOCK_NAME
from kveval.files.rundir import RunDir, StoreError
from kveval.files.startup_failure import TRANSIENT_REASONS


def redo_reason(previous: schema.CellResult, *, retry_failed: bool, budget_given: bool) -> str | None:
    """Why a stored cell of an identical earlier run is measured again, or None to keep it. Kept: a
    finished cell, and one that did not start for a property of its configuration (FP8 unsupported
    here, a pool too small for its length on a fixed budget). Redone: unfinished or crashed cells,
    and failures to start that may pass — memory held by others, a timeout, an interrupt."""
    if not previous.complete:
        return "its earlier run did not finish"
    if previous.crash is not None:
        return f"its earlier run crashed ({previous.crash.message})"
    if previous.started:
        return None
    failure, process = previous.failure, previous.process
    reason = failure.reason if failure is not None else None
    if retry_failed:
        return f"it did not start before ({reason}) and --retry-failed was given"
    if reason in TRANSIENT_REASONS:
        return f"it did not start before for a cause that may pass ({reason}: {failure.message})"
    if process is not None and process.timed_out:
        return "it was stopped at its timeout before its engine was up"
    if reason == "kv_capacity" and not budget_given:
        return "its pool was too small on a budget that depends on the device's free memory (kv_capacity)"
    return None


# Options that change how a run is carried out, not what it measures: a resume may change them.
# `budget` is checked apart (_shrunk_budget): a larger --budget on the same run extends its design.
# prefer, slo: how the deploy answer is chosen from the measurements, not what is measured.
_NOT_FINGERPRINTED = ("cell_timeout_s", "stall_timeout_s", "gpus", "executor", "budget", "prefer", "slo")


_IDENTITY_KEYS = ("revision", "weights")   # inputs/model_identity.py; absent in runs of older kveval builds


def _settings_fingerprint(manifest: dict, earlier: dict | None = None) -> dict:
    # What must match for a re-run into the same directory to reuse finished cells. The weights'
    # identity is compared only when the earlier run recorded it (an older kveval did not).
    out = {key: manifest.get(key) for key in ("model", "options", "prompt_ids", "scoring_ids")}
    out["options"] = {k: v for k, v in (out["options"] or {}).items() if k not in _NOT_FINGERPRINTED}
    if earlier is not None and isinstance(out["model"], dict):
        recorded = earlier.get("model") or {}
        out["model"] = {k: v for k, v in out["model"].items() if k not in _IDENTITY_KEYS or k in recorded}
    return out


def _differences(earlier: dict, now: dict) -> list[str]:
    names = []
    for key in now:
        if isinstance(now[key], dict) and isinstance(earlier.get(key), dict):
            names += [f"{key}.{k}" for k in sorted(set(now[key]) | set(earlier[key]))
                      if now[key].get(k) != earlier[key].get(k)]
        elif now[key] != earlier.get(key):
            names.append(key)
    return names


def earlier_chosen_budget(run_dir: RunDir) -> dict | None:
    """The CPU KV budget kveval chose for an earlier run in this directory, so a resume reuses it
    (free memory differs from one start to the next; the cells must not)."""
    try:
        earlier = run_dir.manifest() if run_dir.exists() else None
    except StoreError:
        return None
    if earlier is None:
        return None
    options = earlier.options
    if not (options.kv_budget_note and options.kv_cache_memory_bytes):
        return None
    return {"bytes": options.kv_cache_memory_bytes, "why": options.kv_budget_note}


def _shrunk_budget(earlier: dict, manifest: dict) -> int | None:
    """The earlier sample cap when this run's --budget would shrink it after rounds were planned under
    it, else None. A resume may keep or raise the cap (the design's N_max: a larger one extends the
    design, analysis/sequential.look_alpha) and change the budget's time freely."""
    before = ((earlier.get("options") or {}).get("budget") or {}).get("samples")
    now = ((manifest.get("options") or {}).get("budget") or {}).get("samples")
    if not before or earlier.get("task_rounds") is None or (now or 0) >= before:
        return None
    return before


def prepare_run_dir(run_dir: RunDir, manifest: dict, fresh: bool = False) -> bool:
    """True when finished cells of an earlier, identical run in this directory can be reused.
    With `fresh`, another run found there is moved aside (never deleted) and this one starts anew."""
    if run_dir.path.exists() and not run_dir.path.is_dir():
        raise KvevalError(f"--out {run_dir.path} exists and is not a directory")
    if not run_dir.exists():
        # The run's own lock file (files/run_lock.py) is there already; anything else is not ours.
        if run_dir.path.is_dir() and any(p.name != LOCK_NAME for p in run_dir.path.iterdir()):
            raise KvevalError(f"--out {run_dir.path} is not empty and is not a kveval run; choose another directory")
        return False
    try:
        earlier = run_dir.load_manifest()
    except StoreError as error:
        if not fresh:
            raise KvevalError(f"--out {run_dir.path}: {error} (--fresh moves it aside and starts anew)") from None
        earlier = None
    if earlier is not None and _settings_fingerprint(earlier) == _settings_fingerprint(manifest, earlier):
        before = _shrunk_budget(earlier, manifest)
        if before is None:
            # The rounds' record (each round's N_max) goes on: a resume plans the rounds again from it, so
            # looks taken keep the alpha they spent (run/rounds.py _earlier_caps).
            if earlier.get("task_rounds") is not None:
                manifest["task_rounds"] = earlier["task_rounds"]
            return True
        if not fresh:
            raise KvevalError(
                f"--out {run_dir.path}: its rounds were planned under --budget {before} paired samples per cell; "
                f"--budget {manifest['options']['budget'].get('text')} would shrink that design after its looks "
                f"were taken. Give --budget {before} or more (a larger budget extends the design), another --out, "
                "or --fresh to move that run aside and start anew")
    if fresh:
        aside = run_dir.path.with_name(f"{run_dir.path.name}.replaced-{_dt.datetime.now():%Y%m%d-%H%M%S}")
        run_dir.path.rename(aside)
        run_dir.path.mkdir()
        return False
    changed = _differences(_settings_fingerprint(earlier), _settings_fingerprint(manifest, earlier))
    raise KvevalError(
        f"--out {run_dir.path} holds a run with different settings ({', '.join(changed[:6])}"
        f"{', ...' if len(changed) > 6 else ''}); give another --out, or --fresh to move that run aside and start "
        "anew (kveval never overwrites measured results)"
    )
