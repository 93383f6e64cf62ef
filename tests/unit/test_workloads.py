"""Tests for kveval.inputs.workloads: exact prompt sizes, names, determinism, user prompt files."""
from __future__ import annotations

import json
import math
import re
from collections import Counter
from pathlib import Path

import pytest

from kveval.inputs import workloads as wl
from kveval.inputs.workloads import (
    DATA_DIR,
    PromptFileError,
    PromptSpec,
    build_workloads,
    load_user_prompts,
    render_chat,
)
from tests.support.char_tokenizer import CharTokenizer

SMOLLM_START = "<|im_start|>"
SMOLLM_GENERATION_PROMPT = "<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def tokenizer():
    """The default model's tokenizer (SmolLM2-135M-Instruct, which has a chat template)."""
    transformers = pytest.importorskip("transformers")
    from kveval.inputs.models import ModelError, prepare_default_model

    try:
        model_dir = prepare_default_model(progress=lambda *a, **k: None)
    except ModelError as e:
        pytest.skip(f"default model directory is missing and cannot be prepared: {e}")
    if not Path(model_dir).is_dir():
        pytest.skip(f"default model directory {model_dir} is missing")
    return transformers.AutoTokenizer.from_pretrained(str(model_dir))


def by_workload(prompts):
    groups: dict[str, list[PromptSpec]] = {}
    for p in prompts:
        groups.setdefault(p.workload, []).append(p)
    return groups


def document_of(p: PromptSpec) -> str:
    """The user turn of a SmolLM-rendered context prompt, minus the trailing question."""
    user = p.text.split("<|im_start|>user\n", 1)[1].split("<|im_end|>", 1)[0]
    return user.rsplit("\n\n", 1)[0]


# --------------------------------------------------------------------------- built-in suite

def test_default_suite_names_counts_and_order(tokenizer):
    prompts = build_workloads(tokenizer, [4096, 2048])
    counts = Counter(p.workload for p in prompts)
    assert counts == {"short_256": 3, "short_512": 2, "probe": 100, "ctx_1k": 2, "ctx_25pct": 1,
                      "ctx_90pct": 1, "over_2048": 1, "over_4096": 1}
    # Fixed order: short, probes, context, over-limit (ascending L).
    assert list(dict.fromkeys(p.workload for p in prompts)) == [
        "short_256", "short_512", "probe", "ctx_1k", "ctx_25pct", "ctx_90pct", "over_2048", "over_4096"]
    for name, group in by_workload(prompts).items():
        assert [p.id for p in group] == [f"{name}-{i}" for i in range(len(group))]
    assert len({p.id for p in prompts}) == len(prompts)

    expected = {"short_256": ("short", 256), "short_512": ("short", 512), "probe": ("probe", 256),
                "ctx_1k": ("context", 256), "ctx_25pct": ("context", 256),
                "ctx_90pct": ("context", 256), "over_2048": ("over_limit", 64),
                "over_4096": ("over_limit", 64)}
    for p in prompts:
        assert (p.kind, p.max_tokens) == expected[p.workload]


def test_probes_are_a_hundred_distinct_questions_set_by_count_and_seed(tokenizer):
    probes = [p for p in build_workloads(tokenizer, [2048]) if p.kind == "probe"]
    assert len(probes) == 100 and len({p.text for p in probes}) == 100
    assert [p.id for p in build_workloads(tokenizer, [2048], counts={"probe": 10}) if p.kind == "probe"] == [
        f"probe-{i}" for i in range(10)]
    assert not [p for p in build_workloads(tokenizer, [2048], counts={"probe": 0}) if p.kind == "probe"]
    other_seed = [p.text for p in build_workloads(tokenizer, [2048], seed=1) if p.kind == "probe"]
    assert other_seed != [p.text for p in probes] and sorted(other_seed) == sorted(p.text for p in probes)
    with pytest.raises(ValueError, match="probes.jsonl has only 100"):
        build_workloads(tokenizer, [2048], counts={"probe": 101})


def test_context_and_over_limit_prompts_have_exact_sizes(tokenizer):
    prompts = build_workloads(tokenizer, [2048, 4096])
    targets = {"ctx_1k": 1000, "ctx_25pct": 1024, "ctx_90pct": math.floor(0.9 * 4096),
               "over_2048": 2049, "over_4096": 4097}
    for p in prompts:
        if p.kind in ("context", "over_limit"):
            assert p.target_tokens == targets[p.workload]
            assert len(p.token_ids) == p.target_tokens
        else:
            assert p.target_tokens is None


def test_text_is_decoded_token_ids(tokenizer):
    for p in build_workloads(tokenizer, [2048]):
        assert p.text == tokenizer.decode(list(p.token_ids), skip_special_tokens=False)


def test_text_re_encodes_to_same_ids_for_default_model(tokenizer):
    # Not promised for every tokenizer, but for the default model the text can be sent instead
    # of the ids without changing the prompt.
    for p in build_workloads(tokenizer, [1500, 3000], seed=3):
        assert tokenizer(p.text, add_special_tokens=False)["input_ids"] == list(p.token_ids)


def test_over_limit_prompt_for_every_distinct_length(tokenizer):
    prompts = build_workloads(tokenizer, [700, 300, 1000, 700],
                              counts={"ctx_25pct": 0, "ctx_90pct": 0})
    over = [p for p in prompts if p.kind == "over_limit"]
    assert [p.workload for p in over] == ["over_300", "over_700", "over_1000"]
    assert [len(p.token_ids) for p in over] == [301, 701, 1001]
    assert all(p.max_tokens == 64 and p.id == f"{p.workload}-0" for p in over)
    # The largest limit is 1000, so a 1000-token prompt would be refused by every cell.
    assert "ctx_1k" not in {p.workload for p in prompts}


def test_fractions_follow_largest_length_and_are_named_from_fraction(tokenizer):
    prompts = build_workloads(tokenizer, [512, 8192], context_fractions=(0.5, 0.333),
                              counts={"ctx_1k": 0, "short_256": 0, "short_512": 0})
    sizes = {p.workload: len(p.token_ids) for p in prompts if p.kind == "context"}
    assert sizes == {"ctx_50pct": 4096, "ctx_33pct": math.floor(0.333 * 8192)}


def test_long_context_repeats_corpus_and_stays_exact(tokenizer):
    prompts = build_workloads(tokenizer, [32768], counts={"short_256": 0, "short_512": 0, "probe": 0,
                                                          "ctx_1k": 0, "ctx_25pct": 0})
    sizes = {p.workload: len(p.token_ids) for p in prompts}
    assert sizes == {"ctx_90pct": 29491, "over_32768": 32769}


def test_chat_template_applied_to_all_prompts(tokenizer):
    for p in build_workloads(tokenizer, [2048]):
        assert p.text.startswith(SMOLLM_START)
        assert p.text.endswith(SMOLLM_GENERATION_PROMPT)
        assert "<|im_start|>user\n" in p.text


def test_render_chat_uses_template_without_extra_special_tokens(tokenizer):
    text, ids = render_chat(tokenizer, "What is a lighthouse?")
    expected = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is a lighthouse?"}], tokenize=False,
        add_generation_prompt=True)
    assert text == expected
    assert ids == tokenizer(expected, add_special_tokens=False)["input_ids"]


def test_short_prompts_come_from_questions_file(tokenizer):
    questions = [json.loads(line)["question"]
                 for line in (DATA_DIR / "questions.jsonl").read_text().splitlines()]
    prompts = build_workloads(tokenizer, [2048])
    short = [p for p in prompts if p.kind == "short"]
    used = [next(q for q in questions if q in p.text) for p in short]
    assert len(set(used)) == len(short) == 5   # short_256 and short_512 never share a question


def test_short_512_unchanged_when_short_256_count_changes(tokenizer):
    def short_512(counts):
        return [p for p in build_workloads(tokenizer, [2048], counts=counts)
                if p.workload == "short_512"]
    assert short_512(None) == short_512({"short_256": 0}) == short_512({"short_256": 6})


# --------------------------------------------------------------------------- determinism

def test_same_inputs_give_identical_prompts(tokenizer):
    a = build_workloads(tokenizer, [1024, 4096], seed=7)
    b = build_workloads(tokenizer, [1024, 4096], seed=7)
    assert [p.to_dict() for p in a] == [p.to_dict() for p in b]


def test_different_seed_changes_documents_not_sizes(tokenizer):
    a = {p.id: p for p in build_workloads(tokenizer, [4096], seed=0)}
    b = {p.id: p for p in build_workloads(tokenizer, [4096], seed=1)}
    assert a.keys() == b.keys()
    for pid in a:
        assert len(a[pid].token_ids) == len(b[pid].token_ids) or a[pid].kind in ("short", "probe")
        if a[pid].kind in ("context", "over_limit"):
            assert document_of(a[pid]) != document_of(b[pid])


def test_prompts_of_one_workload_use_different_document_slices(tokenizer):
    prompts = build_workloads(tokenizer, [4096], counts={"ctx_1k": 4, "over": 3})
    for name in ("ctx_1k", "over_4096"):
        docs = [document_of(p) for p in prompts if p.workload == name]
        assert len(docs) in (3, 4)
        starts = {d[:200] for d in docs}
        assert len(starts) == len(docs)


def test_dropping_a_workload_leaves_others_unchanged(tokenizer):
    full = {p.id: p for p in build_workloads(tokenizer, [2048, 4096])}
    fewer = build_workloads(tokenizer, [2048, 4096], counts={"ctx_1k": 0, "over_2048": 0})
    assert all(full[p.id] == p for p in fewer)
    assert not any(p.workload in ("ctx_1k", "over_2048") for p in fewer)


# --------------------------------------------------------------------------- counts and errors

def test_group_count_keys(tokenizer):
    prompts = build_workloads(tokenizer, [2048], context_fractions=(0.25, 0.5, 0.9),
                              counts={"ctx_pct": 2, "ctx_50pct": 0, "short_256": 0,
                                      "short_512": 0, "probe": 0, "ctx_1k": 0, "over": 0})
    assert Counter(p.workload for p in prompts) == {"ctx_25pct": 2, "ctx_90pct": 2}
    assert set(wl.DEFAULT_COUNTS) <= {"short_256", "short_512", "probe", "ctx_1k", "ctx_pct", "over"}


def test_counts_override(tokenizer):
    prompts = build_workloads(tokenizer, [2048, 4096],
                              counts={"short_256": 1, "short_512": 0, "probe": 3, "ctx_90pct": 2,
                                      "over": 0, "over_4096": 2})
    assert Counter(p.workload for p in prompts) == {
        "short_256": 1, "probe": 3, "ctx_1k": 2, "ctx_25pct": 1, "ctx_90pct": 2, "over_4096": 2}
    assert all(len(p.token_ids) == 4097 for p in prompts if p.workload == "over_4096")


@pytest.mark.parametrize("counts, message", [
    ({"ctx_2k": 1}, "unknown workload"),
    ({"over_999": 1}, "unknown workload"),
    ({"short_256": -1}, ">= 0"),
    ({"short_256": 1.5}, ">= 0"),
    ({"short_256": 10, "short_512": 10}, "questions"),
])
def test_bad_counts_raise(tokenizer, counts, message):
    with pytest.raises(ValueError, match=message):
        build_workloads(tokenizer, [2048], counts=counts)


def test_ctx_1k_requested_but_too_large_raises(tokenizer):
    with pytest.raises(ValueError, match="ctx_1k needs a max_model_len above 1000"):
        build_workloads(tokenizer, [1000], counts={"ctx_1k": 1})


@pytest.mark.parametrize("lens, message", [
    ([], "empty"),
    ([32], "too small"),
    ([4096, 63], "too small"),
    ([128], "overhead"),   # ctx_25pct would be 32 tokens: less than the template + 16
])
def test_bad_max_model_lens_raise(tokenizer, lens, message):
    with pytest.raises(ValueError, match=message):
        build_workloads(tokenizer, lens)


def test_smallest_allowed_length_works_for_over_limit(tokenizer):
    prompts = build_workloads(tokenizer, [64], counts={"ctx_25pct": 0, "ctx_90pct": 0})
    assert [len(p.token_ids) for p in prompts if p.kind == "over_limit"] == [65]


def test_bad_context_fraction_raises(tokenizer):
    with pytest.raises(ValueError, match="between 0 and 1"):
        build_workloads(tokenizer, [2048], context_fractions=(0.5, 1.0))
    with pytest.raises(ValueError, match="duplicate workload names"):
        build_workloads(tokenizer, [2048], context_fractions=(0.251, 0.249))


# --------------------------------------------------------------------------- PromptSpec

def test_prompt_spec_round_trips_through_json(tokenizer):
    for p in build_workloads(tokenizer, [2048], counts={"ctx_1k": 1}):
        d = json.loads(json.dumps(p.to_dict()))
        assert isinstance(d["token_ids"], list)
        q = PromptSpec.from_dict(d)
        assert q == p and isinstance(q.token_ids, tuple)


def test_prompt_spec_from_dict_missing_key():
    with pytest.raises(ValueError, match="token_ids"):
        PromptSpec.from_dict({"id": "a", "workload": "w", "kind": "user", "text": "",
                              "max_tokens": 1})


# --------------------------------------------------------------------------- no chat template

def test_plain_tokenizer_uses_special_tokens_and_exact_sizes():
    tok = CharTokenizer()
    prompts = build_workloads(tok, [2048, 4096])
    for p in prompts:
        assert p.token_ids[0] == CharTokenizer.BOS
        assert p.text == tok.decode(p.token_ids)
        if p.target_tokens is not None:
            assert len(p.token_ids) == p.target_tokens
    text, ids = render_chat(tok, "Hi")
    assert text == "Hi" and ids == [CharTokenizer.BOS, ord("H") + 10, ord("i") + 10]


def test_plain_tokenizer_rejects_multi_turn_messages():
    users = [{"messages": [{"role": "system", "content": "Be brief."},
                           {"role": "user", "content": "Hi"}]}]
    with pytest.raises(ValueError, match="no chat template"):
        build_workloads(CharTokenizer(), [2048], user_prompts=users)


# --------------------------------------------------------------------------- data files

def test_corpus_is_ascii_without_digits_and_about_six_thousand_words():
    files = sorted((DATA_DIR / "corpus").glob("*.txt"))
    assert 4 <= len(files) <= 6
    words = 0
    for f in files:
        text = f.read_text(encoding="utf-8")
        assert text.isascii(), f
        assert not re.search(r"\d", text), f"{f} contains digits (they could look like passkeys)"
        assert "\n\n" in text, f"{f} has no paragraph breaks"
        words += len(text.split())
    assert 5000 <= words <= 7500


def test_questions_file_is_valid():
    lines = (DATA_DIR / "questions.jsonl").read_text(encoding="utf-8").splitlines()
    rows = [json.loads(line) for line in lines]
    assert len(rows) >= 10
    assert all(set(r) == {"id", "question"} and r["question"].strip() for r in rows)
    assert len({r["id"] for r in rows}) == len(rows)


def test_data_dir_override(tmp_path, tokenizer):
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "a.txt").write_text("Alpha beta gamma delta. " * 40 + "\n\nEnd.")
    (tmp_path / "questions.jsonl").write_text('{"id": "q", "question": "Why is the sky blue?"}\n')
    prompts = build_workloads(tokenizer, [2048], data_dir=tmp_path,
                              counts={"short_256": 1, "short_512": 0, "probe": 0})
    assert "Why is the sky blue?" in prompts[0].text
    assert "Alpha beta gamma" in prompts[1].text
    assert all(len(p.token_ids) == p.target_tokens for p in prompts[1:])


# --------------------------------------------------------------------------- user prompt files

def write_lines(tmp_path, *lines) -> Path:
    path = tmp_path / "prompts.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_load_user_prompts_normalises(tmp_path):
    path = write_lines(
        tmp_path,
        '{"prompt": "Tell me about owls."}',
        '',
        '{"id": "chat", "messages": [{"role": "system", "content": "Be terse."},'
        ' {"role": "user", "content": "Hi"}], "max_tokens": 32}',
        '{"name": "named", "prompt": "x", "workload": "mine"}',
        '{"prompt": "y", "workload": "mine"}',
        '{"prompt": "z"}',
    )
    rows = load_user_prompts(path)
    assert rows == [
        {"id": "user-0", "workload": "user", "max_tokens": 256,
         "messages": [{"role": "user", "content": "Tell me about owls."}]},
        {"id": "chat", "workload": "user", "max_tokens": 32,
         "messages": [{"role": "system", "content": "Be terse."},
                      {"role": "user", "content": "Hi"}]},
        {"id": "named", "workload": "mine", "max_tokens": 256,
         "messages": [{"role": "user", "content": "x"}]},
        {"id": "mine-1", "workload": "mine", "max_tokens": 256,
         "messages": [{"role": "user", "content": "y"}]},
        {"id": "user-2", "workload": "user", "max_tokens": 256,
         "messages": [{"role": "user", "content": "z"}]},
    ]


@pytest.mark.parametrize("lines, line, reason", [
    (['{"prompt": "ok"}', '{"prompt": "broken"'], 2, "invalid JSON"),
    (['{"prompt": "ok"}', '[1, 2]'], 2, "expected a JSON object"),
    (['{"max_tokens": 5}'], 1, "exactly one of 'prompt' or 'messages'"),
    (['{"prompt": "a", "messages": [{"role": "user", "content": "b"}]}'], 1, "exactly one of"),
    (['{"prompt": ""}'], 1, "non-empty string"),
    (['{"prompt": "   "}'], 1, "non-empty string"),
    (['{"prompt": 5}'], 1, "non-empty string"),
    (['{"messages": []}'], 1, "non-empty list"),
    (['{"messages": [{"role": "user"}]}'], 1, "string 'content'"),
    (['{"messages": [{"content": "x"}]}'], 1, "'role'"),
    (['{"messages": [{"role": "user", "content": " "}]}'], 1, "empty"),
    (['{"prompt": "a", "max_tokens": 0}'], 1, "positive integer"),
    (['{"prompt": "a", "max_tokens": -3}'], 1, "positive integer"),
    (['{"prompt": "a", "max_tokens": 1.5}'], 1, "positive integer"),
    (['{"prompt": "a", "max_tokens": "10"}'], 1, "positive integer"),
    (['{"prompt": "a", "max_tokens": true}'], 1, "positive integer"),
    (['{"id": "a", "prompt": "x"}', '{"prompt": "y"}', '{"id": "a", "prompt": "z"}'], 3,
     "duplicate id 'a' (first used at line 1)"),
    (['{"prompt": "x"}', '{"id": "user-0", "prompt": "y"}'], 2, "duplicate id 'user-0'"),
    (['{"prompt": "x", "max_token": 5}'], 1, "unknown keys ['max_token']"),
    (['{"prompt": "x", "workload": "has space"}'], 1, "'workload'"),
    (['{"prompt": "x", "id": ""}'], 1, "'id'/'name'"),
    (['{"prompt": "x", "id": "a", "name": "b"}'], 1, "not two different"),
])
def test_bad_user_prompt_lines(tmp_path, lines, line, reason):
    path = write_lines(tmp_path, *lines)
    with pytest.raises(PromptFileError) as info:
        load_user_prompts(path)
    message = str(info.value)
    assert message.startswith(f"{path}:{line}: ")
    assert reason in message
    assert info.value.line == line and info.value.path == str(path)


@pytest.mark.parametrize("content", ["", "\n\n  \n"])
def test_empty_user_prompt_file(tmp_path, content):
    path = tmp_path / "empty.jsonl"
    path.write_text(content)
    with pytest.raises(PromptFileError, match=re.escape(f"{path}: empty file")):
        load_user_prompts(path)


def test_missing_user_prompt_file(tmp_path):
    with pytest.raises(PromptFileError, match="file not found"):
        load_user_prompts(tmp_path / "nope.jsonl")


def test_prompt_file_error_is_value_error():
    assert issubclass(PromptFileError, ValueError)


def test_user_prompts_in_build_workloads(tmp_path, tokenizer):
    path = write_lines(
        tmp_path,
        '{"id": "owls", "prompt": "Tell me about owls.", "max_tokens": 100}',
        '{"messages": [{"role": "system", "content": "You are terse."},'
        ' {"role": "user", "content": "Hi"}], "workload": "chat"}',
    )
    prompts = build_workloads(tokenizer, [2048], user_prompts=load_user_prompts(path),
                              counts={"short_256": 0, "short_512": 0, "probe": 0, "ctx_1k": 0,
                                      "ctx_25pct": 0, "ctx_90pct": 0, "over": 0})
    assert [(p.id, p.workload, p.kind, p.max_tokens, p.target_tokens) for p in prompts] == [
        ("owls", "user", "user", 100, None), ("chat-0", "chat", "user", 256, None)]
    owls, chat = prompts
    assert owls.text == render_chat(tokenizer, "Tell me about owls.")[0]
    assert list(owls.token_ids) == render_chat(tokenizer, "Tell me about owls.")[1]
    # The user's system message replaces the template's default one.
    assert chat.text.startswith("<|im_start|>system\nYou are terse.<|im_end|>\n")
    assert chat.text.endswith(SMOLLM_GENERATION_PROMPT)


def test_user_prompts_accept_raw_dicts_and_validate(tokenizer):
    prompts = build_workloads(tokenizer, [2048], user_prompts=[{"prompt": "Hello"}],
                              counts={"over": 0})
    assert prompts[-1].id == "user-0" and prompts[-1].kind == "user"
    with pytest.raises(PromptFileError, match="user_prompts:2: .*positive integer"):
        build_workloads(tokenizer, [2048],
                        user_prompts=[{"prompt": "a"}, {"prompt": "b", "max_tokens": 0}])


def test_user_prompts_may_not_reuse_builtin_names(tokenizer):
    with pytest.raises(ValueError, match="clash with built-in"):
        build_workloads(tokenizer, [2048], user_prompts=[{"prompt": "a", "workload": "ctx_1k"}])
    with pytest.raises(ValueError, match="duplicate prompt id 'short_256-0'"):
        build_workloads(tokenizer, [2048], user_prompts=[{"prompt": "a", "id": "short_256-0"}])


def test_package_imports_only_stdlib():
    for module in sorted(Path(wl.__file__).parent.glob("*.py")):
        imported = set(re.findall(r"^(?:from|import) ([\w.]+)", module.read_text(), flags=re.M))
        own = {name for name in imported if name.startswith("kveval.inputs.workloads.")}
        assert imported - own <= {"__future__", "json", "math", "random", "re", "dataclasses",
                                  "pathlib", "typing", "kveval.inputs.resources"}, module.name
