"""Before any engine starts: which long-context tasks a run asks for, and their data on disk.

kveval's own tasks get their samples generated here, once per max_model_len, into
run_dir/taskdata/L<len>/ (deterministic from the seed, sized with the model's tokenizer), so every
cell of one length reads the very same items and fp8 and auto can be paired sample by sample.
Other names are passed to lm-eval as they are; they are checked against lm-eval's task index,
which takes lm-eval some 15 s to build, so only when such a name is given.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from kveval.files.rundir import RunDir
from kveval.inputs.task_data import TASKS, resolve_task_names, write_task_data

SKIP = {"none", "no", "off"}


class TaskSelectionError(ValueError):
    """A --tasks / task setting that cannot be used; the message says why and what is known."""


def select_tasks(names: Sequence[str] | None) -> list[str]:
    """None -> kveval's six tasks; "none" -> []; else kveval short/full names and lm-eval task names."""
    if names is None:
        return list(TASKS)
    names = [str(n).strip() for n in names if str(n).strip()]
    if any(n.lower() in SKIP for n in names):
        if len(names) > 1:
            raise TaskSelectionError(f"--tasks none cannot be combined with task names ({', '.join(names)})")
        return []
    if not names:
        return list(TASKS)
    return list(dict.fromkeys(resolve_task_names(names)))


def check_lm_eval_names(names: Sequence[str], tasks_dir: Path) -> None:
    """Unknown task names fail here, before any engine starts, with what lm-eval knows."""
    others = [n for n in names if n not in TASKS]
    if not others:
        return
    from lm_eval.tasks import TaskManager

    known = set(TaskManager(include_path=str(tasks_dir)).all_tasks)
    unknown = [n for n in others if n not in known]
    if unknown:
        raise TaskSelectionError(
            f"unknown task(s): {', '.join(unknown)}. kveval's tasks: {', '.join(t.short for t in TASKS.values())} "
            f"(or 'all', 'none'); any task lm-eval lists with `lm_eval ls tasks` also works when its data is local")


def check_task_settings(fractions: Sequence[float], depths: Sequence[float], samples: int,
                        limit: int | None) -> None:
    for fraction in fractions:
        if not 0 < fraction <= 2:
            raise TaskSelectionError(f"task length {fraction:g} must be a share of max_model_len in (0, 2] "
                                     "(above 1 probes rejection)")
    for depth in depths:
        if not 0 <= depth <= 1:
            raise TaskSelectionError(f"task depth {depth:g} must be in [0, 1]")
    if samples < 1:
        raise TaskSelectionError("task samples per point must be at least 1")
    if limit is not None and limit < 1:
        raise TaskSelectionError("--limit must be at least 1")


@dataclass(frozen=True)
class TaskShape:
    """Which tasks, at which sizes (shares of max_model_len) and depths, how many samples each."""

    names: list[str]
    fractions: tuple[float, ...]
    depths: tuple[float, ...]
    samples: int
    limit: int | None = None


def task_shape(suite, tasks: Sequence[str] | None, fractions: Sequence[float] | None = None,
               depths: Sequence[float] | None = None, samples: int | None = None,
               limit: int | None = None) -> TaskShape:
    """The suite's task preset with the user's settings over it, checked (TaskSelectionError)."""
    shape = TaskShape(select_tasks(tasks),
                      tuple(float(x) for x in (fractions or suite.task_fractions)),
                      tuple(float(x) for x in (depths or suite.task_depths)),
                      int(samples if samples is not None else suite.task_samples), limit)
    check_task_settings(shape.fractions, shape.depths, shape.samples, shape.limit)
    return shape


def write_run_task_data(run_dir: RunDir, tokenizer, lengths: Sequence[int], tasks: Sequence[str], *,
                        model_limit: int | None, fractions: Sequence[float], depths: Sequence[float],
                        samples: int, seed: int) -> dict:
    """Generate kveval-task data per max_model_len. Returns the plan stored in the manifest:
    {"data_dirs": {"1024": "taskdata/L1024", ...}, "files": {...}, "skipped": {"32768": "why"}}."""
    own = [t for t in tasks if t in TASKS]
    data_dirs: dict[str, str] = {}
    files: dict[str, Any] = {}
    skipped: dict[str, str] = {}   # length -> why it has no data
    for length in sorted(set(int(x) for x in lengths)) if own else ():
        if model_limit and length > model_limit:
            skipped[str(length)] = f"beyond the model's own limit ({model_limit} tokens); the cell cannot start"
            continue
        relative = f"{RunDir.TASK_DATA_DIR}/L{length}"
        try:
            written = write_task_data(tokenizer, run_dir.task_data_path(relative), length, own, fractions=fractions,
                                      depths=depths, samples_per_point=samples, seed=seed)
        except ValueError as error:
            skipped[str(length)] = str(error)
            continue
        data_dirs[str(length)] = relative
        files[str(length)] = written
    return {"data_dirs": data_dirs, "files": files, "skipped": skipped}


def spread(count: int, limit: int | None) -> list[int] | None:
    """`limit` indices spread evenly over `count` docs (so a cap keeps every size and depth in
    play rather than the first few); None when there is no cap to apply."""
    if limit is None or limit >= count:
        return None
    if limit == 1:
        return [count // 2]
    return sorted({round(i * (count - 1) / (limit - 1)) for i in range(limit)})
