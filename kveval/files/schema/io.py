"""Reading, writing, schema: `load`/`read`/`parse` a run file (FileError naming the file and each bad
field), `dump` a model back to exactly the dict that was read, `json_schema` of a file kind."""
from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any, TypeVar, get_args, overload

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from kveval.files.schema.base import FileError, FileModel, MAX_REPORTED_ERRORS, _TAGS
from kveval.files.schema.kinds import VERSIONS, _DEFAULT_VERSION, _REDO, _model
from kveval.files.schema.legacy import upgrade


# --- reading, writing, schema ----------------------------------------------------------------------

def _shown(value: Any) -> str:
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "a list"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


_EXPECTED = {"int_type": "an integer", "float_type": "a number", "number_type": "a number",
             "string_type": "a string", "bool_type": "true or false", "list_type": "a list",
             "dict_type": "an object", "model_type": "an object", "model_attributes_type": "an object",
             "none_required": "null"}


def _problem(error: ErrorDetails) -> tuple[tuple[int | str, ...], str]:
    """(location, plain words) for one pydantic error."""
    loc, kind, ctx = tuple(error["loc"]), error["type"], error.get("ctx") or {}
    if kind == "missing":
        return loc, "missing (required)"
    if kind == "extra_forbidden":
        return loc, ("not a field this kveval knows (a file from a newer kveval? its schema_version says "
                     "which kveval reads it)")
    if kind == "missing_when":
        return loc + (ctx["field"],), f"missing ({ctx['why']})"
    if kind in _EXPECTED:
        return loc, f"expected {_EXPECTED[kind]}, got {_shown(error['input'])}"
    if kind == "literal_error":
        return loc, f"expected {ctx.get('expected')}, got {_shown(error['input'])}"
    message = error["msg"].removeprefix("Value error, ")
    return loc, f"{message[:1].lower()}{message[1:]}"


def _where(loc: tuple[int | str, ...]) -> str:
    text = ""
    for part in loc:
        if part in _TAGS:
            continue
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _describe(name: str, error: ValidationError) -> str:
    problems = list(dict.fromkeys(_problem(e) for e in error.errors()))  # unions can repeat one
    lines = [f"{name}: field {_where(loc)}: {what}" if _where(loc) else f"{name}: {what}"
             for loc, what in problems[:MAX_REPORTED_ERRORS]]
    if len(problems) > MAX_REPORTED_ERRORS:
        lines.append(f"{name}: ... and {len(problems) - MAX_REPORTED_ERRORS} more problems")
    return "\n".join(lines)


# Given the model, a reader returns that model's type; given the kind's name, a FileModel.
_Model = TypeVar("_Model", bound=FileModel)


@overload
def parse(kind_or_model: type[_Model], data: Any, name: str = "<data>") -> _Model: ...
@overload
def parse(kind_or_model: str, data: Any, name: str = "<data>") -> FileModel: ...
def parse(kind_or_model: str | type[FileModel], data: Any, name: str = "<data>") -> FileModel:
    """Validate already-read JSON `data`; FileError messages name the file as `name`. Data of the version
    before the current one is upgraded first, in place (`upgrade`)."""
    model = _model(kind_or_model)
    if not isinstance(data, dict):
        raise FileError(f"{name}: expected a JSON object at the top level, got {_shown(data)}")
    upgrade(model, data)
    # The version first: a newer file's other differences would only bury the one that matters.
    version = data.get("schema_version", _DEFAULT_VERSION.get(model))
    expected = VERSIONS[model]
    if isinstance(version, int) and not isinstance(version, bool) and version != expected:
        raise FileError(f"{name}: schema_version {version} — this kveval reads {expected} ({_REDO[model]})")
    try:
        return model.model_validate(data)
    except ValidationError as error:
        raise FileError(_describe(name, error)) from None


@overload
def load(kind_or_model: type[_Model], path: str | Path) -> _Model: ...
@overload
def load(kind_or_model: str, path: str | Path) -> FileModel: ...
def load(kind_or_model: str | type[FileModel], path: str | Path) -> FileModel:
    """Read and validate one run file: kind "manifest", "cell", "results", "kv_ranges", or a model."""
    return parse(kind_or_model, read(path), str(Path(path)))


def read(path: str | Path) -> Any:
    """The JSON of one run file (.gz too), not yet validated; FileError when missing, unreadable or not
    JSON. `parse` it; a valid file's data is what `dump` of its model gives back."""
    path = Path(path)
    try:
        # A published report keeps its results compressed (results.json.gz).
        text = (gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()).decode("utf-8")
    except FileNotFoundError:
        raise FileError(f"{path}: no such file") from None
    except (OSError, EOFError, UnicodeDecodeError) as error:  # gzip.BadGzipFile is an OSError
        raise FileError(f"{path}: cannot be read ({getattr(error, 'strerror', None) or error})") from None
    try:
        data = json.loads(text)  # NaN is allowed: kveval's own writer emits it for NaN logprobs
    except json.JSONDecodeError as error:
        raise FileError(f"{path}: not valid JSON ({error.msg} at line {error.lineno}, column {error.colno})") from None
    return data


def dump(model: FileModel) -> dict[str, Any]:
    """The dict to write back: exactly what was read (keys in the source's order, ints as ints,
    NaN as NaN). Same result as `model.model_dump(exclude_unset=True)`, without pydantic walking
    every token id of a 30 MB cell file: the untyped parts are returned as the model holds them
    (not copied), so copy before changing them."""
    fields, typed = type(model).model_fields, _typed_fields(type(model))
    # Keys as the file spells them: a field named `for_` (a Python keyword) is the file's "for".
    values = {(field.alias or name): _plain(getattr(model, name)) if name in typed else getattr(model, name)
              for name, field in fields.items() if name in model.model_fields_set}
    values.update(model.__pydantic_extra__ or {})
    order = [key for key in model._keys if key in values] + [key for key in values if key not in model._keys]
    return {key: values[key] for key in order}


def _plain(value: Any) -> Any:
    if isinstance(value, FileModel):
        return dump(value)
    if isinstance(value, list):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    return value


_TYPED_FIELDS: dict[type, set[str]] = {}


def _typed_fields(model: type[FileModel]) -> set[str]:
    """Fields whose value can hold a model somewhere inside (the rest is plain JSON as read)."""
    if model not in _TYPED_FIELDS:
        def holds_model(hint: Any) -> bool:
            if isinstance(hint, type) and issubclass(hint, BaseModel):
                return True
            return any(holds_model(arg) for arg in get_args(hint))
        _TYPED_FIELDS[model] = {name for name, field in model.model_fields.items()
                                if holds_model(field.annotation) or any(holds_model(m) for m in field.metadata)}
    return _TYPED_FIELDS[model]


def json_schema(kind_or_model: str | type[FileModel]) -> dict[str, Any]:
    """The JSON Schema of one file kind (what a valid file looks like)."""
    return _model(kind_or_model).model_json_schema()
