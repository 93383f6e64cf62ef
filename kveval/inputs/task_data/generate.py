"""Task docs from the registry: one task's docs for one max_model_len (`generate_task_docs`), and the
JSONL files lm_eval_tasks/utils.py loads (`write_task_data`)."""
from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Sequence

from kveval import defaults
from kveval.inputs.resources import DATA_DIR
from kveval.inputs.task_data.registry import TASKS, resolve_task_names

DEFAULT_FRACTIONS = defaults.TASK_LENGTHS
DEFAULT_DEPTHS = defaults.TASK_DEPTHS


def _number(x: float) -> str:
    """0.25 -> "0.25", 0.5 -> "0.50", 0.125 -> "0.125": two decimals unless more are needed."""
    text = f"{x:.2f}"
    return text if float(text) == x else repr(float(x))


def _check_args(task: str, max_model_len: int, fractions, depths, samples_per_point) -> None:
    if task not in TASKS:
        raise ValueError(f"unknown kveval task {task!r}; known: {', '.join(TASKS)}")
    if isinstance(max_model_len, bool) or not isinstance(max_model_len, int) or max_model_len <= 0:
        raise ValueError(f"max_model_len must be a positive integer, got {max_model_len!r}")
    if not fractions:
        raise ValueError("fractions is empty; give at least one length fraction")
    for f in fractions:
        if not isinstance(f, (int, float)) or isinstance(f, bool) or not f > 0:
            raise ValueError(f"length fraction {f!r} must be a number above 0")
    if not depths:
        raise ValueError("depths is empty; give at least one needle depth")
    for d in depths:
        if not isinstance(d, (int, float)) or isinstance(d, bool) or not 0 <= d <= 1:
            raise ValueError(f"needle depth {d!r} must be between 0 and 1")
    if isinstance(samples_per_point, bool) or not isinstance(samples_per_point, int) \
            or samples_per_point < 1:
        raise ValueError(f"samples_per_point must be an integer >= 1, got {samples_per_point!r}")


def generate_task_docs(tokenizer, task: str, max_model_len: int, *,
                       fractions: Sequence[float] = DEFAULT_FRACTIONS,
                       depths: Sequence[float] = DEFAULT_DEPTHS,
                       samples_per_point: int = 1, seed: int = 0,
                       data_dir: Path = DATA_DIR, round_number: int = 0) -> list[dict]:
    """The docs of one task (full or short name) for one max_model_len, in the SCHEMA.md shape.

    Order: fractions, then depths, then samples. A depth task gets samples_per_point docs per
    (fraction, depth); cwe has no depth and gets samples_per_point x len(depths) per fraction,
    so every task has the same number of docs. Each doc has its own seeded generator, so adding
    a fraction or depth leaves the other docs unchanged.

    `round_number` k > 0: another round of new samples for the same run (run/rounds.py): other
    generators, and ids ending in -r<k>, so that no sample of one round pairs with another's.
    Round 0 is the run's first data, unchanged.
    """
    task = resolve_task_names([task])[0]
    _check_args(task, max_model_len, fractions, depths, samples_per_point)
    spec = TASKS[task]
    sources = spec.sources(tokenizer, Path(data_dir))
    generate = spec.generate
    if spec.uses_depth:
        points = [(d, i) for d in depths for i in range(samples_per_point)]
    else:
        points = [(None, i) for i in range(samples_per_point * len(depths))]
    docs = []
    for fraction in fractions:
        target = round(fraction * max_model_len)
        for depth, i in points:
            key = f"{seed}-{task}-{max_model_len}-{fraction}-{depth}-{i}"
            rng = random.Random(key if not round_number else f"r{round_number}-{key}")
            try:
                text, tokens, needle_depths, outputs = generate(
                    tokenizer, sources, rng, target, depth)
            except ValueError as e:
                raise ValueError(f"{task}, max_model_len {max_model_len}, fraction {fraction}: "
                                 f"{e}") from None
            where = f"-d{_number(depth)}" if depth is not None else ""
            docs.append({
                "id": f"{task}-L{max_model_len}-f{_number(fraction)}{where}-s{i}"
                      + (f"-r{round_number}" if round_number else ""),
                "task": task,
                "input": text,
                "outputs": list(outputs),
                "max_model_len": max_model_len,
                "length_fraction": float(fraction),
                "target_tokens": target,
                "prompt_tokens": tokens,
                "depth": float(depth) if depth is not None else None,
                "needle_depths": needle_depths,
                "max_gen_toks": spec.max_gen_toks,
                "seed": seed,
            })
    return docs


def write_task_data(tokenizer, out_dir, max_model_len: int, tasks, *,
                    fractions: Sequence[float] = DEFAULT_FRACTIONS,
                    depths: Sequence[float] = DEFAULT_DEPTHS,
                    samples_per_point: int = 1, seed: int = 0,
                    data_dir: Path = DATA_DIR, round_number: int = 0) -> dict:
    """Write out_dir/<task>.jsonl for every kveval task among `tasks` (others are skipped:
    lm-eval built-ins need no data). Returns {task: {"file": file name, "docs": count,
    "skipped": {fraction: why}}}. A size too small for a task's question and needles is skipped
    (and said why) rather than costing the task its other sizes; a task with no size left gets
    no file (file None)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = {}
    for task in resolve_task_names(tasks):
        if task not in TASKS:
            continue
        docs, skipped = [], {}
        for fraction in fractions:
            try:
                docs += generate_task_docs(tokenizer, task, max_model_len, fractions=(fraction,), depths=depths,
                                           samples_per_point=samples_per_point, seed=seed, data_dir=data_dir,
                                           round_number=round_number)
            except ValueError as error:
                if "too small" not in str(error):
                    raise
                skipped[str(fraction)] = str(error)
        if not docs:
            written[task] = {"file": None, "docs": 0, "skipped": skipped}
            continue
        name = f"{task}.jsonl"
        lines = "".join(json.dumps(doc, ensure_ascii=False) + "\n" for doc in docs)
        tmp = out / f".{name}.tmp"
        tmp.write_text(lines, encoding="utf-8")
        tmp.replace(out / name)   # never leave a half-written file under the real name
        written[task] = {"file": name, "docs": len(docs), "skipped": skipped}
    return written
