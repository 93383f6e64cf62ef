"""Tests for kveval.inputs.task_data: RULER-style long-context docs sized, placed and seeded exactly."""
from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest

from kveval.inputs import task_data as td
from kveval.inputs.workloads import render_chat
from tests.support.char_tokenizer import CharTokenizer

SCHEMA_KEYS = ["id", "task", "input", "outputs", "max_model_len", "length_fraction",
               "target_tokens", "prompt_tokens", "depth", "needle_depths", "max_gen_toks", "seed"]
DEPTH_TASKS = [name for name, spec in td.TASKS.items() if spec.uses_depth]
NEEDLE = re.compile(r" ?(The pass key is \d+\. Remember it\. \d+ is the pass key\."
                    r"|One of the special magic numbers for [a-z]+-[a-z]+ is: \d+\."
                    r"|VAR [A-Z]{5} = (?:VAR [A-Z]{5}|\d+)\.)")


@pytest.fixture(scope="module")
def tokenizer():
    """The default model's tokenizer (SmolLM2-135M-Instruct); skipped if it is not on disk."""
    transformers = pytest.importorskip("transformers")
    from kveval.inputs.models import default_model_dir

    model_dir = default_model_dir()
    if not (Path(model_dir) / "tokenizer.json").is_file():
        pytest.skip(f"default model directory {model_dir} is missing (run `kveval` once to "
                    f"prepare it)")
    return transformers.AutoTokenizer.from_pretrained(str(model_dir))


def found(value: str, text: str) -> bool:
    return re.search(rf"(?<!\w){re.escape(value)}(?!\w)", text) is not None


def haystack_of(doc: dict) -> str:
    """The user text between the intro and the question."""
    parts = doc["input"].split("\n\n")
    return "\n\n".join(parts[1:-1])


def cwe_items(doc: dict) -> list[str]:
    lines = haystack_of(doc).split("\n")
    words = []
    for i, line in enumerate(lines, start=1):
        number, word = line.split(". ", 1)
        assert int(number) == i
        words.append(word)
    return words


def check_size(tokenizer, doc: dict) -> None:
    assert doc["prompt_tokens"] == len(render_chat(tokenizer, doc["input"])[1])
    assert doc["target_tokens"] == round(doc["length_fraction"] * doc["max_model_len"])
    gap = doc["target_tokens"] - doc["prompt_tokens"]
    assert 0 <= gap <= td.SIZE_TOLERANCE, (doc["id"], gap)


# --------------------------------------------------------------------------- names

def test_task_table_matches_schema():
    assert list(td.TASKS) == ["kveval_passkey", "kveval_niah_single", "kveval_niah_multikey",
                              "kveval_niah_multivalue", "kveval_vt", "kveval_cwe"]
    assert [s.short for s in td.TASKS.values()] == ["passkey", "niah_single", "niah_multikey",
                                                    "niah_multivalue", "vt", "cwe"]
    assert all(name == spec.name for name, spec in td.TASKS.items())
    assert td.TASK_GROUP == "kveval_longctx"
    assert [n for n, s in td.TASKS.items() if not s.uses_depth] == ["kveval_cwe"]


def test_resolve_task_names():
    six = list(td.TASKS)
    assert td.resolve_task_names(["kveval_longctx"]) == six
    assert td.resolve_task_names(["all"]) == six
    assert td.resolve_task_names("passkey,kveval_vt, cwe") == ["kveval_passkey", "kveval_vt",
                                                               "kveval_cwe"]
    # unknown names pass through (lm-eval built-ins); repeats are dropped, order kept
    assert td.resolve_task_names(["gsm8k", "vt", "kveval_vt", "all"]) == ["gsm8k", "kveval_vt"] + [
        n for n in six if n != "kveval_vt"]
    assert td.resolve_task_names([]) == []
    assert td.resolve_task_names(["passkey,vt"]) == ["kveval_passkey", "kveval_vt"]


# --------------------------------------------------------------------------- sizes

@pytest.mark.parametrize("max_model_len, fractions", [
    (256, (0.9,)),
    (1024, (0.25, 0.5, 0.9)),
    (4096, (0.5,)),
    (8192, (0.9,)),
])
def test_sizes_land_at_or_just_under_the_target(tokenizer, max_model_len, fractions):
    for task in td.TASKS:
        docs = td.generate_task_docs(tokenizer, task, max_model_len, fractions=fractions)
        assert len(docs) == 3 * len(fractions)
        for doc in docs:
            check_size(tokenizer, doc)


def test_fraction_above_one_makes_an_over_long_prompt(tokenizer):
    for task in td.TASKS:
        doc, = td.generate_task_docs(tokenizer, task, 512, fractions=(1.5,), depths=(0.5,))
        assert doc["target_tokens"] == 768
        check_size(tokenizer, doc)
        assert doc["prompt_tokens"] > 512


def test_too_small_target_raises(tokenizer):
    for task in td.TASKS:
        with pytest.raises(ValueError, match="too small"):
            td.generate_task_docs(tokenizer, task, 256, fractions=(0.1,))


def test_coarse_tokenizer_still_lands_within_tolerance():
    """Words and list items wider than the tolerance: the fallbacks (a later haystack start,
    longer cwe words) must still close the gap."""
    tok = CharTokenizer()
    for task in td.TASKS:
        docs = td.generate_task_docs(tok, task, 4096, fractions=(0.5, 0.8, 1.1),
                                     depths=(0.2, 0.7))
        for doc in docs:
            check_size(tok, doc)


def test_bad_arguments_raise(tokenizer):
    with pytest.raises(ValueError, match="unknown kveval task"):
        td.generate_task_docs(tokenizer, "gsm8k", 1024)
    with pytest.raises(ValueError, match="depth"):
        td.generate_task_docs(tokenizer, "passkey", 1024, depths=(1.5,))
    with pytest.raises(ValueError, match="fraction"):
        td.generate_task_docs(tokenizer, "passkey", 1024, fractions=(0,))
    with pytest.raises(ValueError, match="samples_per_point"):
        td.generate_task_docs(tokenizer, "passkey", 1024, samples_per_point=0)


# --------------------------------------------------------------------------- doc shape

def test_docs_follow_the_schema(tokenizer):
    for task, spec in td.TASKS.items():
        docs = td.generate_task_docs(tokenizer, spec.short, 1024, fractions=(0.5, 0.9),
                                     depths=(0.1, 0.5), samples_per_point=2, seed=3)
        assert len(docs) == 2 * 2 * 2        # cwe: samples_per_point x len(depths) per fraction
        assert len({d["id"] for d in docs}) == len(docs)
        for doc in docs:
            assert list(doc) == SCHEMA_KEYS
            assert doc["task"] == task and doc["max_gen_toks"] == spec.max_gen_toks
            assert doc["seed"] == 3 and doc["max_model_len"] == 1024
            assert doc["outputs"] and all(isinstance(v, str) and v for v in doc["outputs"])
            if spec.uses_depth:
                assert doc["depth"] in (0.1, 0.5)
                assert doc["needle_depths"] and all(0 <= d <= 1 for d in doc["needle_depths"])
            else:
                assert doc["depth"] is None and doc["needle_depths"] == []
    first = td.generate_task_docs(tokenizer, "passkey", 1024, fractions=(0.25,), depths=(0.5,))[0]
    assert first["id"] == "kveval_passkey-L1024-f0.25-d0.50-s0"
    cwe = td.generate_task_docs(tokenizer, "cwe", 1024, fractions=(0.25,), depths=(0.5,))[0]
    assert cwe["id"] == "kveval_cwe-L1024-f0.25-s0"


@pytest.mark.parametrize("task", DEPTH_TASKS)
def test_needle_sits_at_the_asked_depth(tokenizer, task):
    """The needle asked about first starts where depth x haystack tokens have gone by (+-5 %),
    counted with the real tokenizer on the haystack without needles."""
    docs = td.generate_task_docs(tokenizer, task, 4096, fractions=(0.9,),
                                 depths=(0.1, 0.5, 0.9))
    for doc in docs:
        hay = haystack_of(doc)
        asked = doc["outputs"][0]
        first = next(m for m in NEEDLE.finditer(hay) if found(asked, m.group(0)))
        before = NEEDLE.sub("", hay[:first.start()])
        clean = NEEDLE.sub("", hay)
        share = len(tokenizer(before, add_special_tokens=False)["input_ids"]) / \
            len(tokenizer(clean, add_special_tokens=False)["input_ids"])
        assert share == pytest.approx(doc["depth"], abs=0.05), doc["id"]
        assert doc["needle_depths"][0] == pytest.approx(doc["depth"], abs=0.05)
        assert doc["needle_depths"][0] == pytest.approx(share, abs=0.01)
        # needles are whole sentences at sentence boundaries
        assert hay[first.start() - 1] in ".!?" or first.start() == 0


# --------------------------------------------------------------------------- expected values

def test_passkey_and_single_needle(tokenizer):
    for task in ("passkey", "niah_single"):
        for doc in td.generate_task_docs(tokenizer, task, 2048):
            value, = doc["outputs"]
            needles = NEEDLE.findall(haystack_of(doc))
            assert len(needles) == 1 and found(value, needles[0])
            assert len(value) == (5 if task == "passkey" else 7) and value.isdigit()
            assert len(doc["needle_depths"]) == 1
    doc = td.generate_task_docs(tokenizer, "passkey", 2048)[0]
    assert td.PASSKEY_FILLER in doc["input"]


def test_multikey_asks_one_of_four_keys(tokenizer):
    for doc in td.generate_task_docs(tokenizer, "niah_multikey", 2048):
        needles = re.findall(r"magic numbers for ([a-z]+-[a-z]+) is: (\d+)\.", haystack_of(doc))
        assert len(needles) == 4 and len({k for k, _ in needles}) == 4
        assert len({v for _, v in needles}) == 4
        asked_key = re.search(r"magic number for ([a-z]+-[a-z]+) mentioned", doc["input"]).group(1)
        assert doc["outputs"] == [dict(needles)[asked_key]]
        assert len(doc["needle_depths"]) == 4


def test_multivalue_needs_all_four_values(tokenizer):
    for doc in td.generate_task_docs(tokenizer, "niah_multivalue", 2048):
        needles = re.findall(r"magic numbers for ([a-z]+-[a-z]+) is: (\d+)\.", haystack_of(doc))
        assert len(needles) == 4 and len({k for k, _ in needles}) == 1
        assert sorted(doc["outputs"]) == sorted(v for _, v in needles)
        assert len(set(doc["outputs"])) == 4
        assert needles[0][0] in doc["input"].rsplit("\n\n", 1)[1]   # the question names the key


def test_vt_chain_resolves_to_the_expected_names(tokenizer):
    for doc in td.generate_task_docs(tokenizer, "vt", 2048):
        value = re.search(r"assigned the value (\d+)", doc["input"]).group(1)
        holds = set()
        for name, source in re.findall(r"VAR ([A-Z]{5}) = (VAR [A-Z]{5}|\d+)\.", haystack_of(doc)):
            if source == value or source[4:] in holds:
                holds.add(name)
        assert holds == set(doc["outputs"]) and len(doc["outputs"]) == 5
        assert all(re.fullmatch(r"[A-Z]{5}", n) for n in doc["outputs"])
        assert doc["needle_depths"] == sorted(doc["needle_depths"])   # the chain runs forward
        assert doc["needle_depths"][0] == pytest.approx(doc["depth"], abs=0.1)


def test_cwe_common_words_are_clearly_the_most_frequent(tokenizer):
    for max_model_len in (1024, 8192):
        for doc in td.generate_task_docs(tokenizer, "cwe", max_model_len, fractions=(0.25, 0.9)):
            counts = Counter(cwe_items(doc))
            common = doc["outputs"]
            assert len(common) == 5 and len(set(common)) == 5
            rest = max(n for w, n in counts.items() if w not in common)
            assert min(counts[w] for w in common) >= max(rest + 2, 2 * rest)
            assert {w for w, _ in counts.most_common(5)} == set(common)
            assert all(re.fullmatch(r"[a-z]{4,}", w) for w in counts)


def test_no_digits_in_haystack_except_needles(tokenizer):
    """A planted number must be the only one of its kind in the text."""
    for task in ("niah_single", "niah_multikey", "niah_multivalue", "vt", "passkey"):
        doc = td.generate_task_docs(tokenizer, task, 2048, fractions=(0.5,), depths=(0.5,))[0]
        assert not re.search(r"\d", NEEDLE.sub("", haystack_of(doc)))


# --------------------------------------------------------------------------- determinism

def test_same_seed_same_docs_other_seed_other_docs(tokenizer):
    for task in td.TASKS:
        a = td.generate_task_docs(tokenizer, task, 1024, seed=7)
        b = td.generate_task_docs(tokenizer, task, 1024, seed=7)
        c = td.generate_task_docs(tokenizer, task, 1024, seed=8)
        assert json.dumps(a) == json.dumps(b)
        assert [d["outputs"] for d in a] != [d["outputs"] for d in c]
        assert all(x["input"] != y["input"] for x, y in zip(a, c))


def test_docs_do_not_depend_on_their_neighbours(tokenizer):
    both = td.generate_task_docs(tokenizer, "niah_single", 1024, fractions=(0.5, 0.9))
    alone = td.generate_task_docs(tokenizer, "niah_single", 1024, fractions=(0.9,))
    assert both[3:] == alone


def test_write_task_data_is_byte_identical(tokenizer, tmp_path):
    kwargs = dict(fractions=(0.5,), depths=(0.5, 0.9), samples_per_point=1, seed=0)
    first = td.write_task_data(tokenizer, tmp_path / "a", 1024, ["kveval_longctx", "gsm8k"],
                               **kwargs)
    td.write_task_data(tokenizer, tmp_path / "b", 1024, ["all"], **kwargs)
    assert first == {name: {"file": f"{name}.jsonl", "docs": 2, "skipped": {}} for name in td.TASKS}
    files = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert files == sorted(f"{n}.jsonl" for n in td.TASKS)   # gsm8k skipped, no temp files
    for name in td.TASKS:
        data = (tmp_path / "a" / f"{name}.jsonl").read_bytes()
        assert data == (tmp_path / "b" / f"{name}.jsonl").read_bytes()
        lines = data.decode().splitlines()
        assert len(lines) == 2 and json.loads(lines[0])["task"] == name


def test_generation_is_fast(tokenizer):
    import time

    start = time.perf_counter()
    docs = td.generate_task_docs(tokenizer, "niah_multikey", 32768, fractions=(1.0,),
                                 depths=(0.5,))
    assert docs[0]["prompt_tokens"] > 32000
    assert time.perf_counter() - start < 5   # about 0.1 s on a laptop core


def test_a_size_too_small_for_a_task_is_skipped_not_the_whole_task(tokenizer, tmp_path):
    written = td.write_task_data(tokenizer, tmp_path, 256, ["passkey", "niah_multikey"], fractions=(0.25, 0.9),
                                 depths=(0.5,), samples_per_point=1, seed=0)
    passkey = written["kveval_passkey"]
    assert passkey["docs"] == 1 and set(passkey["skipped"]) == {"0.25"} and "too small" in passkey["skipped"]["0.25"]
    docs = [json.loads(line) for line in (tmp_path / "kveval_passkey.jsonl").read_text().splitlines()]
    assert [d["length_fraction"] for d in docs] == [0.9]
    multikey = written["kveval_niah_multikey"]  # ~173 tokens of question and needles: 230 fits, 64 does not
    assert multikey["docs"] == 1 and multikey["file"] == "kveval_niah_multikey.jsonl"
