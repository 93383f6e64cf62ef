"""Issue 38: `kveval compare --chat-template-kwargs JSON` (vLLM's chat_template_kwargs). A thinking template
(Qwen3 style: enable_thinking) would spend the short task answers inside <think>; the arguments reach every
chat rendering (parent prompts, task data, the worker's lm-eval prompts), the manifest, the review and the
resume check. Bad input is one line, exit 2, before any engine starts."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from kveval.cli.commands import cli
from kveval.errors import KvevalError
from kveval.files import schema
from kveval.files.cell_spec import CellSpec
from kveval.files.rundir import RunDir, write_json_atomic
from kveval.inputs.workloads import ChatTemplateTokenizer, build_workloads, render_chat, with_chat_template_kwargs

NO_THINKING = {"enable_thinking": False}
# Qwen3's rule: enable_thinking false renders an empty think block after the generation prompt.
THINKING_TEMPLATE = (
    "{%- for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}"
    "{%- if add_generation_prompt %}<|assistant|>\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}"
    "{%- endif %}")


@pytest.fixture(scope="module")
def thinking_tokenizer():
    """A one-token-per-character tokenizer (transformers' PreTrainedTokenizerFast) with a thinking template."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = sorted({chr(c) for c in range(32, 127)} | {"\n"})
    vocab = {"[UNK]": 0, **{c: i + 1 for i, c in enumerate(chars)}}
    core = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("[\\s\\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()   # decode gives the text back, not characters joined by spaces
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="[UNK]")
    tokenizer.chat_template = THINKING_TEMPLATE
    return tokenizer


def _refused(args: list[str], fragment: str, tmp_path, monkeypatch) -> str:
    def no_engine(*_, **__):
        raise AssertionError("the run was set up: an engine could have started")

    monkeypatch.setattr("kveval.run.setup.set_up_run", no_engine)
    result = CliRunner().invoke(cli, ["compare", "--out", str(tmp_path / "o"), *args])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and not isinstance(result.exception, AssertionError)
    assert fragment in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
    assert not (tmp_path / "o").exists()
    return result.output


# --- the option ---------------------------------------------------------------------------------

def test_the_option_is_parsed_once_into_a_dict_for_the_api(monkeypatch):
    seen = {}

    def fake_compare(**kwargs):
        seen.update(kwargs)
        raise KvevalError("stopped by the test")

    monkeypatch.setattr("kveval.api.compare", fake_compare)
    result = CliRunner().invoke(cli, ["compare", "--chat-template-kwargs", '{"enable_thinking": false, "n": 2}'])
    assert result.exit_code == 2 and "stopped by the test" in result.output
    assert seen["chat_template_kwargs"] == {"enable_thinking": False, "n": 2}

    seen.clear()
    CliRunner().invoke(cli, ["compare"])
    assert seen["chat_template_kwargs"] is None   # left out: none


@pytest.mark.parametrize("text, fragment", [
    ("{enable_thinking: false}", "is not JSON"),
    ('{"enable_thinking": false', "is not JSON"),
    ('["enable_thinking"]', "is an array, not a JSON object"),
    ('"enable_thinking"', "is a string, not a JSON object"),
    ("false", "is a boolean, not a JSON object"),
    ('{"tokenize": true}', "tokenize is set by kveval itself"),
])
def test_bad_json_is_one_line_exit_2_and_no_engine(text, fragment, tmp_path, monkeypatch):
    output = _refused(["--chat-template-kwargs", text], fragment, tmp_path, monkeypatch)
    assert "--chat-template-kwargs" in output


def test_the_api_refuses_a_key_that_is_not_a_string_and_values_that_are_not_json():
    from kveval.api import compare_options

    with pytest.raises(KvevalError, match=r"key 1 is not a name"):
        compare_options(kv=["fp8", "auto"], max_model_len=[1024], chat_template_kwargs={1: True})
    with pytest.raises(KvevalError, match=r"must be a JSON object"):
        compare_options(kv=["fp8", "auto"], max_model_len=[1024], chat_template_kwargs=["enable_thinking"])
    with pytest.raises(KvevalError, match=r"the values must be JSON"):
        compare_options(kv=["fp8", "auto"], max_model_len=[1024], chat_template_kwargs={"x": object()})
    assert compare_options(max_model_len=[1024], chat_template_kwargs={}).chat_template_kwargs is None
    assert compare_options(max_model_len=[1024], chat_template_kwargs=NO_THINKING).chat_template_kwargs == NO_THINKING


# --- rendering ------------------------------------------------------------------------------------

def test_render_chat_passes_the_kwargs_to_the_template(thinking_tokenizer):
    plain_text, plain_ids = render_chat(thinking_tokenizer, "What is 2+2?")
    tokenizer = with_chat_template_kwargs(thinking_tokenizer, NO_THINKING)
    text, ids = render_chat(tokenizer, "What is 2+2?")
    assert plain_text == "<|user|>What is 2+2?\n<|assistant|>\n"
    assert text == plain_text + "<think>\n\n</think>\n\n"
    assert ids == thinking_tokenizer(text, add_special_tokens=False)["input_ids"] and ids != plain_ids
    # enable_thinking true is the template's other branch: the same as not given
    assert render_chat(with_chat_template_kwargs(thinking_tokenizer, {"enable_thinking": True}), "Hi") == \
        render_chat(thinking_tokenizer, "Hi")
    assert with_chat_template_kwargs(thinking_tokenizer, None) is thinking_tokenizer
    assert with_chat_template_kwargs(tokenizer, {}) is thinking_tokenizer        # unwrapped, not wrapped twice
    assert isinstance(tokenizer, ChatTemplateTokenizer) and tokenizer.unk_token == "[UNK]"   # the rest forwarded


def test_the_parents_prompts_and_task_data_are_rendered_with_them(thinking_tokenizer):
    from kveval.inputs.task_data import generate_task_docs

    tokenizer = with_chat_template_kwargs(thinking_tokenizer, NO_THINKING)
    counts = {"short_256": 1, "short_512": 0, "probe": 0, "ctx_1k": 0, "ctx_pct": 1, "over": 0}
    prompts = build_workloads(tokenizer, [512], counts=counts, context_fractions=(0.5,))
    assert {p.kind for p in prompts} == {"short", "context"}
    for prompt in prompts:   # the question, and the document's frame, end in the empty think block
        assert prompt.text.endswith("<|assistant|>\n<think>\n\n</think>\n\n"), prompt.text[-60:]
    context = next(p for p in prompts if p.kind == "context")
    assert len(context.token_ids) == context.target_tokens == 256   # sized with the think block counted

    doc = generate_task_docs(tokenizer, "passkey", 2048, fractions=(0.5,), depths=(0.5,), samples_per_point=1)[0]
    assert doc["prompt_tokens"] == len(render_chat(tokenizer, doc["input"])[1])
    assert doc["prompt_tokens"] == len(render_chat(thinking_tokenizer, doc["input"])[1]) + len("<think>\n\n</think>\n\n")


def test_the_worker_gets_them_in_its_spec_and_its_lm_eval_prompts_match_the_parents(thinking_tokenizer):
    from lm_eval.api.instance import Instance

    from kveval.inputs.suites import SUITES
    from kveval.run.settings import build_phase_options
    from kveval.run.options import CompareOptions
    from kveval.worker.lmeval_lm import EngineLM

    options = build_phase_options(CompareOptions(chat_template_kwargs=NO_THINKING), SUITES["quick"], [], ["passkey"])
    assert options.tasks.chat_template_kwargs == NO_THINKING
    spec = CellSpec(cell_id="fp8-1024", run_dir="/r", engine={"model": "/m"}, kv_spec="fp8", phases=["tasks"],
                    phase_options=options, workloads_path="/r/w.json", result_path="/r/c.json",
                    events_path="/r/c.events", log_path="/r/c.log")
    read_back = CellSpec.model_validate(json.loads(json.dumps(spec.model_dump(mode="json"))))
    assert read_back.phase_options.tasks.chat_template_kwargs == NO_THINKING

    class Engine:
        batches: list = []

        def generate_batch(self, requests):
            self.batches.append(requests)
            return [{"accepted": True, "rejection": None, "error": None, "text": "4", "finish_reason": "stop",
                     "output_tokens": 1, "wall_seconds": 0.1} for _ in requests]

    engine = Engine()
    # as worker/phases/tasks.run builds it from the spec's tasks options
    tokenizer = with_chat_template_kwargs(thinking_tokenizer, read_back.phase_options.tasks.chat_template_kwargs)
    lm = EngineLM(engine, tokenizer, max_model_len=512)
    request = Instance(request_type="generate_until", doc={}, arguments=("What is 2+2?", {"until": ["\n"]}),
                       idx=0, metadata=("kveval_passkey", 0, 1))
    assert lm.generate_until([request]) == ["4"]
    ids = engine.batches[0][0][0]
    assert ids == render_chat(with_chat_template_kwargs(thinking_tokenizer, NO_THINKING), "What is 2+2?")[1]
    assert ids != render_chat(thinking_tokenizer, "What is 2+2?")[1]


# --- manifest, review, resume ---------------------------------------------------------------------

def _manifest_options(chat_template_kwargs) -> dict:
    from kveval.inputs.model_config import ModelFacts
    from kveval.inputs.models import ModelInfo
    from kveval.inputs.suites import SUITES
    from kveval.inputs.task_selection import task_shape
    from kveval.run.settings import build_phase_options
    from kveval.run.state import new_manifest
    from kveval.run.options import CompareOptions
    from tests.support.char_tokenizer import CharTokenizer

    options = CompareOptions(kv=("fp8", "auto"), max_model_len=(1024,), chat_template_kwargs=chat_template_kwargs)
    suite = SUITES["quick"]
    phase_options = build_phase_options(options, suite, [], ["passkey"])
    manifest = new_manifest(options, suite, task_shape(suite, ["passkey"]), ModelInfo("m", "/m", "local directory", True),
                         CharTokenizer(), ModelFacts(), [], [], phase_options, {}, None, [], {})
    return manifest["options"]


def _typed(options: dict) -> schema.Manifest:
    from tests.support.constructed import planned_manifest

    manifest = json.loads(json.dumps({**planned_manifest([]), "options": options}))
    typed = schema.parse(schema.Manifest, manifest, "manifest.json")
    assert schema.dump(typed) == manifest                                    # re-written byte for byte
    return typed


def test_the_manifest_records_them_only_when_given():
    given = _manifest_options(NO_THINKING)
    assert given["chat_template_kwargs"] == NO_THINKING
    assert "chat_template_kwargs" not in given["phase_options"]["tasks"]     # recorded once, in options
    assert _typed(given).options.chat_template_kwargs == NO_THINKING

    absent = _manifest_options(None)
    assert "chat_template_kwargs" not in absent                              # older manifests: the same keys
    assert _typed(absent).options.chat_template_kwargs is None


def test_the_review_names_them_where_it_describes_the_prompts():
    from tests.support.constructed import planned_manifest
    from tests.support.review import review_of

    manifest = planned_manifest([])
    assert "Chat-template arguments" not in review_of(manifest, [], {})
    manifest["options"]["chat_template_kwargs"] = NO_THINKING
    lines = review_of(manifest, [], {}).splitlines()
    prompts = next(i for i, line in enumerate(lines) if line.startswith("- **Prompts:**"))
    assert lines[prompts + 1] == '- **Chat-template arguments:** `{"enable_thinking": false}` (--chat-template-kwargs)'
    manifest["prompt_format"]["chat_template"] = False
    assert "(--chat-template-kwargs): no effect, the model has no chat template" in review_of(manifest, [], {})


def test_a_resume_with_other_chat_template_kwargs_is_another_run(tmp_path):
    from kveval.run.resume import prepare_run_dir
    from tests.support.constructed import planned_manifest

    out = RunDir(tmp_path / "run")
    earlier = planned_manifest([])
    write_json_atomic(out.manifest_path, earlier)
    assert prepare_run_dir(out, json.loads(json.dumps(earlier))) is True     # none, none: the same run

    now = json.loads(json.dumps(earlier))
    now["options"]["chat_template_kwargs"] = NO_THINKING
    with pytest.raises(KvevalError, match=r"different settings \(options.chat_template_kwargs\)"):
        prepare_run_dir(out, now)

    earlier["options"]["chat_template_kwargs"] = NO_THINKING
    write_json_atomic(out.manifest_path, earlier)
    assert prepare_run_dir(out, json.loads(json.dumps(earlier))) is True     # the same arguments: resumed
    other = json.loads(json.dumps(earlier))
    other["options"]["chat_template_kwargs"] = {"enable_thinking": True}
    with pytest.raises(KvevalError, match=r"options.chat_template_kwargs"):
        prepare_run_dir(out, other)
