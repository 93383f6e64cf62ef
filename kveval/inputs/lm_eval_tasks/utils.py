"""lm-eval hooks for kveval's long-context tasks (the YAMLs next to this file).

Self-contained on purpose (stdlib + `datasets` only, no kveval import), so the stock CLI can run
these tasks: `lm_eval --include_path "$(kveval tasks path)" --tasks kveval_longctx --metadata '{"data_dir": DIR}'`.

The docs are not generated here. They depend on the model's tokenizer and on max_model_len, so
kveval writes them once per length (`kveval tasks generate ...`, see kveval/inputs/task_data/) and every
KV-cache dtype then reads the same files. lm-eval calls `custom_dataset` with the task's
metadata as keyword arguments: the YAML's `version`, `config_source` (the YAML path) and whatever
was given to --metadata / TaskManager(metadata=...); the CLI merges --model_args in as well.
Only `data_dir` is used here; the KVEVAL_TASK_DATA environment variable is the fallback.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import datasets

DATA_ENV = "KVEVAL_TASK_DATA"
GENERATE_HINT = "kveval tasks generate --model M --max-model-len L --out DIR"


def load_task_docs(task: str, **kwargs) -> datasets.DatasetDict:
    """<data_dir>/<task>.jsonl as a DatasetDict with one "test" split."""
    data_dir = kwargs.get("data_dir") or os.environ.get(DATA_ENV)
    if not data_dir:
        raise ValueError(
            f"{task}: no task data directory. Generate the docs with `{GENERATE_HINT}` and pass "
            f"the directory with --metadata '{{\"data_dir\": \"DIR\"}}' (or set {DATA_ENV}=DIR).")
    path = Path(str(data_dir)).expanduser() / f"{task}.jsonl"
    if not path.is_file():
        raise FileNotFoundError(
            f"{task}: {path} does not exist. Generate it with `{GENERATE_HINT}` "
            f"(DIR = {Path(str(data_dir)).expanduser()}).")
    rows = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: invalid JSON ({e.msg})") from None
    if not rows:
        raise ValueError(f"{path} holds no docs; regenerate it with `{GENERATE_HINT}`")
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})


def kveval_passkey_docs(**kwargs):
    return load_task_docs("kveval_passkey", **kwargs)


def kveval_niah_single_docs(**kwargs):
    return load_task_docs("kveval_niah_single", **kwargs)


def kveval_niah_multikey_docs(**kwargs):
    return load_task_docs("kveval_niah_multikey", **kwargs)


def kveval_niah_multivalue_docs(**kwargs):
    return load_task_docs("kveval_niah_multivalue", **kwargs)


def kveval_vt_docs(**kwargs):
    return load_task_docs("kveval_vt", **kwargs)


def kveval_cwe_docs(**kwargs):
    return load_task_docs("kveval_cwe", **kwargs)


# --------------------------------------------------------------------------- scoring

def _found(value: str, prediction: str) -> bool:
    """Case-insensitive whole-token match: "71432" is not found in "714321" or "a71432"."""
    value = value.strip().casefold()
    if not value:
        return False
    return re.search(rf"(?<!\w){re.escape(value)}(?!\w)", prediction.casefold()) is not None


def string_match_all(prediction: str, expected) -> float:
    """Share of the expected values found in the prediction (0.0 when nothing is expected:
    a doc without expected values is broken, and must not count as solved)."""
    if isinstance(expected, str):
        expected = [expected]
    expected = list(expected or [])
    if not expected:
        return 0.0
    prediction = prediction or ""
    return sum(1.0 for v in expected if _found(str(v), prediction)) / len(expected)


def process_results(doc: dict, results: list) -> dict:
    """all_match: 1.0 only if every expected value is in the answer; partial_match: the share."""
    prediction = results[0] if results else ""
    share = string_match_all(prediction if isinstance(prediction, str) else "", doc["outputs"])
    return {"all_match": 1.0 if share >= 1.0 else 0.0, "partial_match": share}
