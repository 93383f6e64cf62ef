"""Tests for tasks/: the lm-eval YAMLs, their group, and the self-contained tasks/utils.py."""
from __future__ import annotations

import ast
import importlib.util
import json
import sys
from pathlib import Path

import pytest

from kveval.inputs import task_data as td
from tests.support.char_tokenizer import CharTokenizer

from kveval.inputs.resources import LM_EVAL_TASKS_DIR as TASKS_DIR
UTILS = TASKS_DIR / "utils.py"
GENERATE_HINT = "kveval tasks generate --model M --max-model-len L --out DIR"


def read_yaml(path: Path) -> dict:
    """The YAML with `!function x.y` kept as the string "x.y" (no import)."""
    yaml = pytest.importorskip("yaml")

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_constructor("!function", lambda loader, node: loader.construct_scalar(node))
    return yaml.load(path.read_text(encoding="utf-8"), Loader=Loader)


@pytest.fixture(scope="module")
def utils():
    spec = importlib.util.spec_from_file_location("kveval_test_task_utils", UTILS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("taskdata")
    written = td.write_task_data(CharTokenizer(), out, 4096, ["kveval_longctx"],
                                 fractions=(0.5, 0.9), depths=(0.2, 0.8), samples_per_point=1,
                                 seed=0)
    assert set(written) == set(td.TASKS)
    return out


@pytest.fixture(scope="module")
def loaded(data_dir):
    """TaskManager over tasks/ only (indexing the ~10k built-in YAMLs takes ~15 s; the clash
    test below covers them)."""
    pytest.importorskip("lm_eval")
    from lm_eval.tasks import TaskManager

    manager = TaskManager(include_path=str(TASKS_DIR), include_defaults=False,
                          metadata={"data_dir": str(data_dir)})
    return manager, manager.load([td.TASK_GROUP])


# --------------------------------------------------------------------------- YAML files

def test_one_yaml_per_task_matching_taskspec():
    names = sorted(p.stem for p in TASKS_DIR.glob("*.yaml"))
    assert names == sorted([*td.TASKS, td.TASK_GROUP])
    for name, spec in td.TASKS.items():
        assert spec.yaml == TASKS_DIR / f"{name}.yaml" and spec.yaml.is_file()
        cfg = read_yaml(spec.yaml)
        assert cfg["task"] == name
        assert cfg["output_type"] == "generate_until"
        assert cfg["test_split"] == "test"
        assert cfg["custom_dataset"] == spec.docs_hook == f"utils.{name}_docs"
        assert cfg["process_results"] == spec.scoring == "utils.process_results"
        assert cfg["doc_to_text"] == "{{input}}"
        assert cfg["num_fewshot"] == 0
        gen = cfg["generation_kwargs"]
        assert gen["max_gen_toks"] == spec.max_gen_toks
        assert gen["do_sample"] is False and gen["temperature"] == 0.0 and gen["until"] == []
        assert [m["metric"] for m in cfg["metric_list"]] == list(spec.metrics) == ["all_match", "partial_match"]
        assert all(m["aggregation"] == "mean" and m["higher_is_better"] is True
                   for m in cfg["metric_list"])
        assert "version" in cfg["metadata"]


def test_group_yaml_lists_the_six_in_order():
    cfg = read_yaml(TASKS_DIR / f"{td.TASK_GROUP}.yaml")
    assert cfg["group"] == td.TASK_GROUP
    assert cfg["task"] == list(td.TASKS)
    assert [m["metric"] for m in cfg["aggregate_metric_list"]] == ["all_match", "partial_match"]


def test_utils_is_self_contained():
    """The stock lm-eval CLI must be able to import it without kveval installed."""
    tree = ast.parse(UTILS.read_text(encoding="utf-8"))
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add((node.module or "").split(".")[0])
    allowed = set(sys.stdlib_module_names) | {"datasets", "__future__"}
    assert imported <= allowed, imported - allowed
    for name in td.TASKS:
        assert f"def {name}_docs(" in UTILS.read_text(encoding="utf-8")


def test_names_do_not_clash_with_lm_eval_builtins():
    lm_eval = pytest.importorskip("lm_eval")
    builtin = Path(lm_eval.__file__).parent / "tasks"
    for path in builtin.rglob("*.yaml"):
        text = path.read_text(encoding="utf-8", errors="replace")
        assert "kveval" not in text, path


# --------------------------------------------------------------------------- loading

def test_task_manager_loads_the_group_and_every_task(loaded, data_dir):
    manager, result = loaded
    assert result["group_map"][td.TASK_GROUP] == list(td.TASKS)
    assert set(result["tasks"]) == set(td.TASKS)
    for name, task in result["tasks"].items():
        rows = [json.loads(line) for line in
                (data_dir / f"{name}.jsonl").read_text(encoding="utf-8").splitlines()]
        docs = list(task.eval_docs)
        assert len(docs) == len(rows) == 4
        assert [d["id"] for d in docs] == [r["id"] for r in rows]
        assert task.doc_to_text(docs[0]) == rows[0]["input"]   # no templating changes
        assert task.doc_to_target(docs[0]) == rows[0]["outputs"]
        assert task.config.generation_kwargs["max_gen_toks"] == td.TASKS[name].max_gen_toks
        assert task.config.metadata["data_dir"] == str(data_dir)
        perfect = task.process_results(docs[0], [", ".join(rows[0]["outputs"])])
        assert perfect == {"all_match": 1.0, "partial_match": 1.0}
        assert task.process_results(docs[0], ["no idea"])["all_match"] == 0.0


def test_missing_data_dir_or_file_says_how_to_generate(utils, monkeypatch, tmp_path):
    monkeypatch.delenv(utils.DATA_ENV, raising=False)
    with pytest.raises(ValueError, match="no task data directory") as e:
        utils.kveval_passkey_docs(version=1.0)
    assert GENERATE_HINT in str(e.value)
    with pytest.raises(FileNotFoundError) as e:
        utils.kveval_vt_docs(data_dir=str(tmp_path), version=1.0, config_source="x.yaml")
    assert str(tmp_path / "kveval_vt.jsonl") in str(e.value) and GENERATE_HINT in str(e.value)
    (tmp_path / "kveval_cwe.jsonl").write_text("\n")
    with pytest.raises(ValueError, match="no docs"):
        utils.kveval_cwe_docs(data_dir=str(tmp_path))


def test_env_var_is_the_fallback(utils, monkeypatch, data_dir):
    monkeypatch.setenv(utils.DATA_ENV, str(data_dir))
    ds = utils.kveval_niah_single_docs(version=1.0, pretrained="some/model")
    assert list(ds) == ["test"] and len(ds["test"]) == 4
    # an explicit data_dir wins over the environment
    monkeypatch.setenv(utils.DATA_ENV, "/nonexistent")
    assert len(utils.kveval_cwe_docs(data_dir=str(data_dir))["test"]) == 4


# --------------------------------------------------------------------------- scoring

@pytest.mark.parametrize("prediction, expected, share", [
    ("71432", ["71432"], 1.0),
    ("The pass key is 71432.", ["71432"], 1.0),
    ("714321", ["71432"], 0.0),              # whole tokens only
    ("a71432", ["71432"], 0.0),
    ("", ["71432"], 0.0),
    ("anything", [], 0.0),                   # nothing expected: never counts as solved
    ("ABCDE, fghij", ["abcde", "FGHIJ"], 1.0),   # case-insensitive
    ("abcde", ["abcde", "fghij"], 0.5),
    ("1234567 and 7654321", ["7654321", "1234567", "1111111", "2222222"], 0.5),
    ("Größe straße", ["GRÖSSE"], 1.0),           # Unicode case folding
    ("café", ["CAFÉ"], 1.0),
    ("cafés", ["café"], 0.0),
    ("quiet-harbor: 1", ["quiet-harbor"], 1.0),
    ("x", ["  "], 0.0),                      # a blank expected value is never found
])
def test_string_match_all(utils, prediction, expected, share):
    assert utils.string_match_all(prediction, expected) == pytest.approx(share)


def test_process_results_all_and_partial(utils):
    doc = {"outputs": ["1111111", "2222222", "3333333", "4444444"]}
    assert utils.process_results(doc, ["1111111 2222222 3333333 4444444"]) == \
        {"all_match": 1.0, "partial_match": 1.0}
    assert utils.process_results(doc, ["1111111, 3333333"]) == \
        {"all_match": 0.0, "partial_match": 0.5}
    assert utils.process_results(doc, []) == {"all_match": 0.0, "partial_match": 0.0}
    assert utils.process_results(doc, [None]) == {"all_match": 0.0, "partial_match": 0.0}
    assert utils.string_match_all("abc", "abc") == 1.0   # a bare string is one value


def test_lm_eval_scores_an_oracle_end_to_end(loaded, data_dir):
    """simple_evaluate over the group with a fake model that answers from the files: every
    task scores 1.0 except one half-answered multivalue doc, and the group averages by size."""
    from lm_eval import evaluator
    from lm_eval.api.model import LM

    answers = {}
    for name in td.TASKS:
        for line in (data_dir / f"{name}.jsonl").read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            half = name == "kveval_niah_multivalue" and row["id"].endswith("f0.50-d0.20-s0")
            answers[row["input"]] = " ".join(row["outputs"][:2] if half else row["outputs"])

    class Oracle(LM):
        def loglikelihood(self, requests, disable_tqdm=False):
            raise NotImplementedError

        def loglikelihood_rolling(self, requests, disable_tqdm=False):
            raise NotImplementedError

        def generate_until(self, requests, disable_tqdm=False):
            assert all(r.args[1]["max_gen_toks"] in {s.max_gen_toks for s in td.TASKS.values()}
                       for r in requests)
            return [answers[r.args[0]] for r in requests]

    manager, _ = loaded
    out = evaluator.simple_evaluate(model=Oracle(), tasks=[td.TASK_GROUP], task_manager=manager,
                                    log_samples=True)
    results = out["results"]
    for name in td.TASKS:
        expected = 0.75 if name == "kveval_niah_multivalue" else 1.0
        assert results[name]["all_match,none"] == pytest.approx(expected), name
    assert results["kveval_niah_multivalue"]["partial_match,none"] == pytest.approx(0.875)
    assert results[td.TASK_GROUP]["all_match,none"] == pytest.approx(23 / 24)
    sample = out["samples"]["kveval_passkey"][0]
    assert sample["target"] == sample["doc"]["outputs"] and sample["all_match"] == 1.0


def test_a_samples_selection_numbers_requests_by_position_and_the_log_by_document(loaded, data_dir):
    """lm-eval's own behaviour behind tasks._renumber_requests: with `samples=[3, 1]` the requests carry
    doc_id 0 and 1 (document order) while the sample log labels position p samples[p]; renumbered the
    same way, each request meets the log entry of its own document (kveval's selections are sorted)."""
    from lm_eval import evaluator
    from lm_eval.api.model import LM

    from kveval.worker.phases.tasks import _renumber_requests

    seen = []

    class Recorder(LM):
        def loglikelihood(self, requests, disable_tqdm=False):
            raise NotImplementedError

        def loglikelihood_rolling(self, requests, disable_tqdm=False):
            raise NotImplementedError

        def generate_until(self, requests, disable_tqdm=False):
            seen.extend({"doc_id": r.doc_id, "input": r.args[0]} for r in requests)
            return ["" for _ in requests]

    manager, _ = loaded
    out = evaluator.simple_evaluate(model=Recorder(), tasks=["kveval_passkey"], task_manager=manager,
                                    log_samples=True, samples={"kveval_passkey": [3, 1]})
    logged = {entry["doc_id"]: entry["doc"]["input"] for entry in out["samples"]["kveval_passkey"]}
    assert sorted(logged) == [1, 3] and sorted(r["doc_id"] for r in seen) == [0, 1]
    _renumber_requests(seen, [3, 1])
    assert {r["doc_id"]: r["input"] for r in seen} == logged
