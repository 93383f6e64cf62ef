"""The lm-eval bridge and the tasks phase's pure parts, with a fake engine (no vLLM).

The real engine runs them in tests/integration/test_tasks_engine.py.
"""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from lm_eval.api.instance import Instance

from kveval.cli.commands import cli
from kveval.worker.lmeval_lm import EngineLM
from kveval.worker.phases.tasks import sample_records
from kveval.inputs.task_selection import TaskSelectionError, check_task_settings, select_tasks, spread
from kveval.inputs.task_data import TASKS
from kveval.inputs.workloads import render_chat


class FakeEngine:
    """Answers "echo:<n prompt tokens>" and remembers every batch it was given."""

    def __init__(self):
        self.batches = []
        self.scored = []

    def generate_batch(self, requests):
        self.batches.append(requests)
        return [{"accepted": True, "rejection": None, "error": None, "text": f"echo:{len(ids)}",
                 "finish_reason": "stop", "output_tokens": 3, "wall_seconds": 0.1} for ids, _, _ in requests]

    def score(self, sequences, top_k):
        self.scored.append(sequences)
        # Every position: logprob -0.5, and the true token is the top candidate except at the last one.
        out = []
        for ids in sequences:
            positions = [{"token": t, "logprob": -0.5, "top": [[t if i < len(ids) - 2 else -1, -0.1]]}
                         for i, t in enumerate(ids[1:])]
            out.append({"accepted": True, "rejection": None, "error": None, "positions": positions})
        return out


def _gen(context: str, max_gen: int, doc_id: int, task="kveval_passkey"):
    return Instance(request_type="generate_until", doc={}, arguments=(context, {"until": ["\n\n"], "max_gen_toks": max_gen}),
                    idx=0, metadata=(task, doc_id, 1))


def test_samples_that_fit_go_in_one_batch_and_over_long_ones_are_rejected(tokenizer):
    engine = FakeEngine()
    short, long = "What is two plus two?", "word " * 400
    short_len = len(render_chat(tokenizer, short)[1])
    lm = EngineLM(engine, tokenizer, max_model_len=short_len + 16)
    answers = lm.generate_until([_gen(short, 16, 0), _gen(long, 16, 1), _gen(short, 17, 2)])
    assert answers == [f"echo:{short_len}", "", ""]           # order kept; rejected ones answer ""
    assert len(engine.batches) == 1 and len(engine.batches[0]) == 1
    ids, max_gen, stop = engine.batches[0][0]
    assert ids == render_chat(tokenizer, short)[1] and max_gen == 16 and stop == ["\n\n"]
    first, too_long, no_room = lm.records
    assert first["accepted"] is True and first["prompt_tokens"] == short_len
    assert too_long["accepted"] is False and "does not fit max_model_len" in too_long["rejection"]
    assert too_long["prompt_tokens"] > short_len + 16           # measured in full, never cut down
    assert no_room["accepted"] is False                         # prompt fits, prompt + answer budget does not


def test_loglikelihood_sums_the_continuation_and_reports_greediness(tokenizer):
    engine = FakeEngine()
    lm = EngineLM(engine, tokenizer, max_model_len=512)
    request = Instance(request_type="loglikelihood", doc={}, arguments=("The sky is", " blue and wide"),
                       idx=0, metadata=("t", 0, 1))
    (logprob, greedy), = lm.loglikelihood([request])
    context_ids, continuation_ids = lm._encode_pair("The sky is", " blue and wide")
    assert engine.scored[0][0] == context_ids + continuation_ids
    assert logprob == pytest.approx(-0.5 * len(continuation_ids))
    assert greedy is False                                      # the fake's last position is not top-1


def test_sample_records_join_requests_with_lm_eval_metrics():
    requests = [
        {"task": "kveval_passkey", "doc_id": 0, "prompt_tokens": 100, "max_gen_toks": 16, "accepted": True,
         "rejection": None, "error": None, "response": "12345", "finish_reason": "stop", "output_tokens": 3, "seconds": 0.1},
        {"task": "kveval_passkey", "doc_id": 1, "prompt_tokens": 900, "max_gen_toks": 16, "accepted": False,
         "rejection": "kveval: ... does not fit", "error": None, "response": "", "finish_reason": None,
         "output_tokens": None, "seconds": None},
    ]
    docs = [{"id": f"p-{i}", "length_fraction": f, "depth": 0.5, "target_tokens": t, "outputs": ["12345"]}
            for i, (f, t) in enumerate([(0.25, 128), (1.1, 560)])]
    logged = {"kveval_passkey": [
        {"doc_id": i, "doc": docs[i], "target": ["12345"], "metrics": ["all_match", "partial_match"],
         "all_match": 1.0 if i == 0 else 0.0, "partial_match": 1.0 if i == 0 else 0.0} for i in range(2)]
        + [{"doc_id": 2, "doc": {"id": "p-2"}, "metrics": ["all_match"], "all_match": 0.0}]}
    rows = {r.sample_id: r for r in sample_records(logged, requests)}
    assert rows["p-0"].score == 1.0 and rows["p-0"].correct is True and rows["p-0"].partial == 1.0
    assert rows["p-1"].accepted is False and rows["p-1"].score is None and rows["p-1"].correct is None
    assert rows["p-1"].rejection.startswith("kveval:") and rows["p-1"].target_tokens == 560
    assert rows["p-2"].error == "lm-eval made no request for this sample" and rows["p-2"].score is None


def test_builtin_task_metrics_are_taken_from_lm_eval_and_lists_are_not_scores():
    requests = [{"task": "mmlu_x", "doc_id": 0, "prompt_tokens": 50, "max_gen_toks": 0, "accepted": True,
                 "rejection": None, "error": None, "response": "logprob -1", "seconds": 0.01}] * 4
    logged = {"mmlu_x": [{"doc_id": 0, "doc": {"question": "q"}, "target": 2, "metrics": ["acc", "bleu"],
                          "acc": 1, "bleu": ("a", "b")}]}
    row, = sample_records(logged, requests)
    assert row.metric == "acc" and row.score == 1.0 and row.requests == 4 and row.expected == ["2"]


def test_spread_keeps_samples_over_the_whole_range():
    assert spread(9, None) is None and spread(9, 9) is None and spread(9, 20) is None
    assert spread(9, 1) == [4]
    assert spread(9, 3) == [0, 4, 8]
    assert spread(54, 6) == [0, 11, 21, 32, 42, 53]


def test_task_selection():
    assert select_tasks(None) == list(TASKS)
    assert select_tasks(["none"]) == [] and select_tasks(["None"]) == []
    assert select_tasks(["passkey", "kveval_vt", "niah_single_1"]) == ["kveval_passkey", "kveval_vt", "niah_single_1"]
    assert select_tasks(["all"]) == list(TASKS)
    with pytest.raises(TaskSelectionError, match="cannot be combined"):
        select_tasks(["none", "passkey"])


@pytest.mark.parametrize("fractions, depths, samples, limit, message", [
    ((0,), (0.5,), 1, None, "share of max_model_len"),
    ((2.5,), (0.5,), 1, None, "share of max_model_len"),
    ((0.5,), (1.5,), 1, None, "depth"),
    ((0.5,), (0.5,), 0, None, "at least 1"),
    ((0.5,), (0.5,), 1, 0, "--limit"),
])
def test_bad_task_settings_are_refused(fractions, depths, samples, limit, message):
    with pytest.raises(TaskSelectionError, match=message):
        check_task_settings(fractions, depths, samples, limit)


@pytest.mark.parametrize("args, message", [
    (["--tasks", "none", "passkey"], "cannot be combined"),
    (["--task-lengths", "half"], "is not a number"),
    (["--task-depths", "1.5"], "depth 1.5 must be in [0, 1]"),
    (["--limit", "0"], "--limit must be at least 1"),
    (["--task-samples", "0"], "at least 1"),  # not silently the suite's default
    (["--full", "--suite", "quick"], "contradict"),
])
def test_compare_refuses_bad_task_options_before_any_engine(tmp_path, args, message):
    result = CliRunner().invoke(cli, ["compare", "--out", str(tmp_path / "r"), "--max-model-len", "512", *args])
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
    assert not (tmp_path / "r").exists()


def test_tasks_list_and_generate_for_the_stock_cli(tmp_path, default_model_dir):
    runner = CliRunner()
    listed = runner.invoke(cli, ["tasks", "list"])
    assert listed.exit_code == 0 and all(name in listed.output for name in TASKS)
    out = tmp_path / "data"
    made = runner.invoke(cli, ["tasks", "generate", "--model", str(default_model_dir), "--max-model-len", "1024",
                               "--out", str(out), "--tasks", "passkey,cwe", "--task-depths", "0.5"])
    assert made.exit_code == 0, made.output
    docs = [json.loads(line) for line in (out / "kveval_passkey.jsonl").read_text().splitlines()]
    assert len(docs) == 3 and {d["max_model_len"] for d in docs} == {1024}
    assert (out / "kveval_cwe.jsonl").is_file() and not (out / "kveval_vt.jsonl").exists()
    builtin = runner.invoke(cli, ["tasks", "generate", "--model", str(default_model_dir), "--max-model-len", "1024",
                                  "--out", str(out), "--tasks", "niah_single_1"])
    assert builtin.exit_code == 2 and "only kveval's own tasks" in builtin.output


def test_ruler_style_per_length_metrics_score_by_the_cells_length():
    # lm-eval's RULER tasks log one metric per context length and -1 for the others.
    requests = [{"task": "niah_single_1", "doc_id": 0, "prompt_tokens": 865, "max_gen_toks": 128, "accepted": True,
                 "rejection": None, "error": None, "response": "1235580", "seconds": 0.5}]
    entry = {"doc_id": 0, "doc": {"outputs": ["1235580"]}, "metrics": ["4096", "8192", "1024"],
             "4096": -1, "8192": -1, "1024": 1.0}
    row, = sample_records({"niah_single_1": [entry]}, requests, max_model_len=1024)
    assert row.metric == "1024" and row.score == 1.0 and row.correct is True
    row, = sample_records({"niah_single_1": [dict(entry, metrics=["4096", "1024"])]}, requests)
    assert row.metric == "1024"  # without the length: the first metric that holds a real score
