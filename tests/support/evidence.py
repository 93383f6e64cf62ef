"""Typed evidence from the parts a test builds: `typed_evidence(partial)` fills every part the partial
dict leaves out with an empty, valid value (empty lists and dicts, None, 0, "") and parses the whole
with `schema.parse(schema.Evidence, ...)`, so the gate and the run's planners get the `schema.Evidence`
that `build_evidence` gives, holding only what the test chose.

The filling follows the models in kveval/files/schema/ (required fields only: an optional field left
out stays absent, as in a stored file), so a model that gains a required field needs no change here."""
from __future__ import annotations

import types
from typing import Annotated, Any, Literal, Mapping, Union, get_args, get_origin

from pydantic import BaseModel, Discriminator, Tag

from kveval.analysis.cell_records import BASELINE_KV
from kveval.files import schema


def typed_evidence(partial: dict[str, Any]) -> schema.Evidence:
    """`partial` (any subset of results.json's evidence, nested parts partial too) as `schema.Evidence`."""
    start = {"schema_version": schema.RESULTS_VERSION, "baseline_kv": BASELINE_KV,
             # As the gate took a dict without the key: tasks were planned when task evidence is there.
             "tasks_planned": bool(partial.get("tasks"))}
    document = _model(schema.Evidence, {**start, **partial})
    return schema.parse(schema.Evidence, document, "the test's evidence")


def _model(model: type[BaseModel], data: dict[str, Any]) -> dict[str, Any]:
    by_key = {field.alias or name: field for name, field in model.model_fields.items()}
    out = {key: _fill(by_key[key].annotation, value, by_key[key].metadata) if key in by_key else value
           for key, value in data.items()}
    for key, field in by_key.items():
        if key not in out and field.is_required():
            out[key] = _empty(field.annotation, field.metadata)
    return out


def _fill(hint: Any, value: Any, metadata: list | None = None) -> Any:
    """`value` with the models inside it completed."""
    hint, metadata = _unwrap(hint, metadata)
    if value is None:
        return None
    if isinstance(hint, type) and issubclass(hint, BaseModel):
        return _model(hint, value) if isinstance(value, dict) else value
    origin, args = get_origin(hint), get_args(hint)
    if origin is list and args and isinstance(value, list):
        return [_fill(args[0], item) for item in value]
    if origin is dict and len(args) == 2 and isinstance(value, dict):
        return {key: _fill(args[1], item) for key, item in value.items()}
    if origin in (Union, types.UnionType):
        branch = _branch(args, metadata, value)
        return value if branch is None else _fill(branch, value)
    return value


def _empty(hint: Any, metadata: list | None = None) -> Any:
    """The empty value of a required field left out."""
    if hint is schema.Number:
        return 0
    hint, metadata = _unwrap(hint, metadata)
    if isinstance(hint, type) and issubclass(hint, BaseModel):
        return _model(hint, {})
    origin, args = get_origin(hint), get_args(hint)
    if origin in (Union, types.UnionType):
        if type(None) in args:
            return None
        tagged = [arg for arg in args if _tag(arg) not in (None, "<full>")]  # {} for "no task ran"
        return _empty(tagged[0] if tagged else args[0])
    if origin is Literal:
        return args[0]
    return {list: [], dict: {}, str: "", int: 0, float: 0.0, bool: False}.get(origin or hint)


def _unwrap(hint: Any, metadata: list | None) -> tuple[Any, list]:
    metadata = list(metadata or [])
    while get_origin(hint) is Annotated:
        hint, *more = get_args(hint)
        metadata += more
    return hint, metadata


def _tag(hint: Any) -> str | None:
    if get_origin(hint) is Annotated:
        return next((m.tag for m in get_args(hint)[1:] if isinstance(m, Tag)), None)
    return None


def _branch(args: tuple, metadata: list, value: Any) -> Any:
    """The member of a union that `value` is parsed as: a tagged union's by its discriminator, else
    the one model among the members (None when there is no model to complete)."""
    discriminator = next((m for m in metadata if isinstance(m, Discriminator)), None)
    if discriminator is not None and callable(discriminator.discriminator):
        tag = discriminator.discriminator(value)
        return next((arg for arg in args if _tag(arg) == tag), None)
    models = [arg for arg in args if isinstance(_unwrap(arg, None)[0], type)
              and issubclass(_unwrap(arg, None)[0], BaseModel)]
    return models[0] if len(models) == 1 else None


def typed_manifest(partial: dict[str, Any] | schema.Manifest | None = None) -> schema.Manifest:
    """`partial` (any subset of manifest.json, nested parts partial too) as `schema.Manifest`, completed
    like `typed_evidence`: what a test leaves out is empty (required fields only). A typed manifest
    comes back as it is."""
    if isinstance(partial, schema.Manifest):
        return partial
    start = {"schema_version": schema.MANIFEST_VERSION}
    document = _model(schema.Manifest, {**start, **(partial or {})})
    return schema.parse(schema.Manifest, document, "the test's manifest")


def typed_cell(facts: dict[str, Any] | schema.CellResult, name: str = "<cell>") -> schema.CellResult:
    """A test's cell dict (as a stored cells/<cell>.json holds it) as the typed `schema.CellResult` the
    analyses take; a typed cell is passed through. A bad field raises schema.FileError naming it."""
    return facts if isinstance(facts, schema.CellResult) else schema.parse(schema.CellResult, facts, f"cell {name}")


def typed_cells(cells: Mapping[str, dict[str, Any] | schema.CellResult]) -> dict[str, schema.CellResult]:
    """Every cell of a test's cell -> facts dict typed (see `typed_cell`)."""
    return {name: typed_cell(facts, name) for name, facts in cells.items()}


def typed_record(record: dict[str, Any] | schema.GenerationRecord | None) -> schema.GenerationRecord | None:
    """A test's generation record dict as the typed `schema.GenerationRecord`."""
    if record is None or isinstance(record, schema.GenerationRecord):
        return record
    return schema.GenerationRecord.model_validate(record)
