"""Building blocks of every run file's model: the version of each file kind, `FileError`, `Number`
(an int stays an int), `FileModel` (unknown keys refused, the source's key order kept) and the tagged
"either this or that" shapes."""
from __future__ import annotations

from typing import Annotated, Any, Callable, Union

from pydantic import (BaseModel, ConfigDict, Discriminator, ModelWrapValidatorHandler, PlainValidator, PrivateAttr,
                      SerializerFunctionWrapHandler, Tag, WithJsonSchema, model_serializer, model_validator)
from pydantic_core import PydanticCustomError
from typing_extensions import Self


# Issue 17 raised the three below: the user's KV spec text (fp8, auto, fp8:keep=3,17) is `kv_spec` in every
# file, and `kv_cache_dtype` is only ever vLLM's engine dtype (engine_settings, a planned cell's engine, a
# diagnosis). Files of the version before are read through `upgrade`.
MANIFEST_VERSION = 2   # 2: cells[].kv_spec (renamed: _UPGRADES)
CELL_VERSION = 2       # 2: schema_version written first, kv_spec (renamed: _UPGRADES); 1: no schema_version
RESULTS_VERSION = 3    # 3: kv_spec in the evidence's cells and rows (renamed: _UPGRADES); 2: evidence holds
                       # acceptance, sample_outputs and speed_settings (render reads no cell)
KV_RANGES_VERSION = 1  # a failed K/V range pass writes {"error": ...} with no version: means 1

MAX_REPORTED_ERRORS = 5


class FileError(Exception):
    """A run file that is missing, not JSON, or not what this kveval writes; the message says where."""


# --- building blocks -----------------------------------------------------------------------------

def _number(value: Any) -> Any:
    # Not float: pydantic would turn 5 into 5.0, and a re-written file must keep the 5.
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PydanticCustomError("number_type", "expected a number")
    return value


Number = Annotated[Union[int, float], PlainValidator(_number), WithJsonSchema({"type": "number"})]


class FileModel(BaseModel):
    """Base: unknown keys refused, strict types, and the source's key order kept for `dump`. The few
    open records (`_Open`) say why they keep keys they do not declare."""

    model_config = ConfigDict(extra="forbid", strict=True, protected_namespaces=())
    # A plain default, not default_factory=list: some pydantic releases inspect a factory's signature on
    # every instance (inspect.signature(list) parses its text signature), 9 of a look's 11 s on the H200 host.
    _keys: tuple[str, ...] = PrivateAttr(default=())

    @model_validator(mode="wrap")
    @classmethod
    def _remember_key_order(cls, data: Any, handler: ModelWrapValidatorHandler[Self]) -> Self:
        made = handler(data)
        if isinstance(data, dict):
            made._keys = tuple(data)
        return made

    @model_serializer(mode="wrap")
    def _in_source_order(self, handler: SerializerFunctionWrapHandler) -> Any:
        # pydantic writes declared fields first, extras after; the file's own order is what we read.
        out = handler(self)
        if not self._keys or not isinstance(out, dict):
            return out
        ordered = {key: out[key] for key in self._keys if key in out}
        ordered.update((key, value) for key, value in out.items() if key not in ordered)
        return ordered


def _missing(field: str, why: str) -> PydanticCustomError:
    """A key required only in some shapes of a file (e.g. capacity for a started cell)."""
    return PydanticCustomError("missing_when", "{field} is missing ({why})", {"field": field, "why": why})


# Tags of the "either this or that" shapes below; they are not fields, so error messages skip them.
_TAGS = {"<full>", "<empty>", "<failed>"}


def _either(full: Any, other: Any, other_tag: str, is_other: Callable[[Any], bool]) -> Any:
    """The full model, or a small other shape (e.g. {} or {"error": ...}) told apart by `is_other`;
    a tagged union, so a damaged full value reports its own fields, not every branch's."""
    return Annotated[Union[Annotated[full, Tag("<full>")], Annotated[other, Tag(other_tag)]],
                     Discriminator(lambda value: other_tag if is_other(value) else "<full>")]
