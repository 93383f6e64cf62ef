"""Issue 42: `kveval compare`'s options are declared once, in CompareOptions (kveval/run/option_model.py).
The click options, the README's option table and the manifest's options record follow from it; these
tests keep each of them from drifting away from the model."""
from __future__ import annotations

import ast
import dataclasses
import importlib.util
from pathlib import Path

import pytest
from click.testing import CliRunner

from kveval.api import CompareOptions, KvevalError, command_line_options, compare_options
from kveval.cli.commands import cli, compare_arguments
from kveval.files import schema
from kveval.run.option_model import Cli, Recorded, field_metadata

ROOT = Path(__file__).resolve().parents[2]
FIELDS = [field.name for field in dataclasses.fields(CompareOptions)]
# Keys of manifest.json's options that no option fills: set-up's own facts.
SET_UP_KEYS = {"kv_budget_note"}


def _options_table():
    spec = importlib.util.spec_from_file_location("options_table", ROOT / "scripts" / "options_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_readme_option_table_is_the_one_the_model_writes():
    script = _options_table()
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert script.readme_table(readme) == script.table(), (
        "README.md's option table differs from the options model's: run python scripts/options_table.py --write")


def test_every_option_of_the_model_is_a_flag_of_compare_with_its_help():
    command = cli.commands["compare"]
    params = {param.name: param for param in command.params}
    options = command_line_options()
    assert [option.name for option in options] == [param.name for param in command.params]
    for option in options:
        param = params[option.name]
        assert tuple(param.opts) == option.flags and param.help == option.help, option.name
    assert options[0].readme, "the first option starts the README's first row"


def test_baseline_takes_the_options_the_model_gives_it():
    names = [param.name for param in cli.commands["baseline"].params]
    assert names == [option.name for option in command_line_options() if option.baseline]
    assert "kv" not in names and "gate_overrides" not in names and "seed" in names and "dtype" in names


def test_report_and_gate_take_the_models_gate_options():
    for name in ("report", "gate"):
        flags = {flag for param in cli.commands[name].params for flag in param.opts}
        assert {"--gate-config", "--threshold"} <= flags


def test_the_matrix_syntax_reaches_the_api_as_the_fields_types():
    command = cli.commands["compare"]
    context = command.make_context("compare", ["--kv", "fp8", "auto", "--max-model-len", "2048", "8k", "32768",
                                               "--task-lengths", "0.25", "50%", "--dtype", "float16", "--full"])
    arguments = compare_arguments(context.params)
    assert arguments["kv"] == ("fp8", "auto") and arguments["max_model_len"] == (2048, 8192, 32768)
    assert arguments["task_lengths"] == (0.25, 0.5) and arguments["engine_args"] == {"dtype": "float16"}
    assert arguments["suite"] == "full"
    assert "concurrency" not in arguments and "phases" not in arguments   # left out: the API's defaults
    options = compare_options(**{key: value for key, value in arguments.items() if key != "command"})
    assert options.max_model_len == (2048, 8192, 32768) and options.phases == CompareOptions().phases


def test_a_value_of_the_wrong_type_through_the_api_is_one_line_naming_the_flag():
    with pytest.raises(KvevalError, match=r"^--seed 'x': Input should be a valid integer") as error:
        compare_options(max_model_len=[1024], seed="x")
    assert "\n" not in str(error.value)


def test_a_bad_value_on_the_command_line_is_one_line_before_any_engine(tmp_path):
    result = CliRunner().invoke(cli, ["compare", "--out", str(tmp_path / "o"), "--seed", "x"])
    assert result.exit_code == 2 and "'x' is not a valid integer" in result.output and "Traceback" not in result.output


def test_every_field_says_where_the_manifest_records_it():
    recorded = {name: field_metadata(name, Recorded) for name in FIELDS}
    assert all(recorded.values()), [name for name, where in recorded.items() if where is None]
    keys = {where.key for where in recorded.values() if where.key}
    manifest_keys = set(schema.Options.model_fields)
    assert keys <= manifest_keys, f"not keys of the manifest's options: {sorted(keys - manifest_keys)}"
    assert manifest_keys - keys == SET_UP_KEYS, (
        f"manifest options no field records: {sorted(manifest_keys - keys - SET_UP_KEYS)}; declare them with "
        "Recorded(key) on their CompareOptions field")
    for where in recorded.values():
        assert where.key or where.elsewhere   # not recorded in options: the field says where, or why not


def _written_option_keys() -> set[str]:
    """The keys run/state.py writes into manifest.json's options: the `options` dict of _manifest and the
    keywords of `manifest["options"].update(...)` in new_manifest."""
    tree = ast.parse((ROOT / "kveval" / "run" / "state.py").read_text(encoding="utf-8"))
    written = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values):
                if isinstance(key, ast.Constant) and key.value == "options" and isinstance(value, ast.Dict):
                    written |= {k.value for inner in ast.walk(value) if isinstance(inner, ast.Dict)
                                for k in inner.keys if isinstance(k, ast.Constant)}
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "update"
                and isinstance(node.func.value, ast.Subscript) and getattr(node.func.value.slice, "value", None) == "options"):
            written |= {keyword.arg for keyword in node.keywords}
    return written


def test_the_manifest_writer_writes_every_key_the_model_declares():
    declared = {field_metadata(name, Recorded).key for name in FIELDS} - {None}
    written = _written_option_keys()
    assert declared | SET_UP_KEYS <= written, f"declared but not written by run/state.py: {sorted(declared - written)}"


def test_cli_declarations_are_complete():
    for name in FIELDS:
        cli_of = field_metadata(name, Cli)
        if cli_of is not None:
            assert cli_of.help and all(flag.startswith("--") for flag in cli_of.flags), name
