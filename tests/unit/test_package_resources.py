"""The files shipped inside the package (kveval.inputs.resources) and `kveval tasks path`."""
from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from kveval.cli.commands import cli
from kveval.inputs.resources import DATA_DIR, LM_EVAL_TASKS_DIR


def test_data_dir_holds_the_prompt_corpus():
    assert DATA_DIR.is_dir()
    assert (DATA_DIR / "questions.jsonl").is_file()
    corpus = sorted((DATA_DIR / "corpus").glob("*.txt"))
    assert corpus and all(p.stat().st_size > 0 for p in corpus)


def test_lm_eval_tasks_dir_holds_the_yamls_and_utils():
    assert LM_EVAL_TASKS_DIR.is_dir()
    assert (LM_EVAL_TASKS_DIR / "kveval_longctx.yaml").is_file()
    assert (LM_EVAL_TASKS_DIR / "utils.py").is_file()


def test_tasks_path_prints_the_task_directory():
    result = CliRunner().invoke(cli, ["tasks", "path"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert len(lines) == 1, result.output
    printed = Path(lines[0])
    assert printed.is_absolute()
    assert printed == LM_EVAL_TASKS_DIR.resolve()
    assert printed.samefile(LM_EVAL_TASKS_DIR)
