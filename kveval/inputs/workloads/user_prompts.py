"""User prompt files (--prompts JSONL): read, checked line by line, brought to one form, rendered."""
from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from kveval.inputs.workloads.chat import decode, render_messages
from kveval.inputs.workloads.records import PromptFileError, PromptSpec

USER_MAX_TOKENS = 256
USER_WORKLOAD = "user"
_USER_KEYS = {"id", "name", "prompt", "messages", "max_tokens", "workload"}
_WORKLOAD_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


# Every prompt goes to every cell and every output is kept (workloads.json, each cell's file): past this a
# run is hours per cell and its files hundreds of MB, so a bigger file is refused before it is even read.
MAX_USER_PROMPTS = 10_000


def read_jsonl(path: Path) -> list[tuple[int, dict]]:
    """(line number, object) for each non-blank line; PromptFileError on unreadable input. Streamed, and
    stopped at MAX_USER_PROMPTS + 1 objects, so a huge file costs seconds and bounded memory."""
    try:
        handle = Path(path).open(encoding="utf-8")
    except FileNotFoundError:
        raise PromptFileError(path, None, "file not found") from None
    except OSError as e:
        raise PromptFileError(path, None, f"cannot read file: {e.strerror or e}") from None
    rows = []
    with handle:
        try:
            for lineno, line in enumerate(handle, start=1):
                if not line.strip():
                    continue   # blank lines are harmless, e.g. a trailing newline
                if len(rows) == MAX_USER_PROMPTS:
                    raise PromptFileError(path, lineno, f"more than {MAX_USER_PROMPTS:,} prompts: every prompt goes "
                                                        "to every cell and every output is kept; split the file "
                                                        "or keep the prompts that matter")
                rows.append(_parse_line(path, lineno, line))
        except UnicodeDecodeError as e:
            raise PromptFileError(path, None, f"not UTF-8 text ({e.reason})") from None
        except OSError as e:
            raise PromptFileError(path, None, f"cannot read file: {e.strerror or e}") from None
    return rows


def _parse_line(path: Path, lineno: int, line: str) -> tuple[int, dict]:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise PromptFileError(path, lineno, f"invalid JSON: {e.msg} (column {e.colno})") from None
    if not isinstance(obj, dict):
        raise PromptFileError(path, lineno, f"expected a JSON object, got {type(obj).__name__}")
    return lineno, obj


_ABSENT: Any = object()   # a key the user did not give (null is a value, and a wrong one)


class _Invalid(ValueError):
    """What is wrong with one user prompt (the caller names the file and line)."""


@dataclass(frozen=True)
class _Message:
    """One chat message as given: `role` and `content` (other keys of the message are dropped)."""

    role: Any = _ABSENT
    content: Any = _ABSENT

    @classmethod
    def of(cls, message: Mapping[str, Any]) -> "_Message":
        return cls(**{key: message[key] for key in ("role", "content") if key in message})


def _check_messages(messages: Any) -> str | None:
    """None if `messages` is a usable chat, else what is wrong with it."""
    if not isinstance(messages, list) or not messages:
        return "'messages' must be a non-empty list"
    for k, m in enumerate(messages):
        if not isinstance(m, dict):
            return f"messages[{k}] must be an object with 'role' and 'content'"
        message = _Message.of(m)
        if not isinstance(message.role, str) or not message.role.strip():
            return f"messages[{k}] needs a non-empty string 'role'"
        if not isinstance(message.content, str):
            return f"messages[{k}] needs a string 'content'"
    if not any(_Message.of(m).content.strip() for m in messages):
        return "all messages are empty"
    return None


@dataclass(frozen=True)
class _UserPrompt:
    """One user prompt (a --prompts line, or a dict given to build_workloads), checked on its own by
    `parse`: exactly one of `prompt` or `messages`, and the optional keys of _USER_KEYS with their
    defaults. What depends on the other lines (default ids, duplicates) is normalise_user_prompts's."""

    prompt: Any = _ABSENT
    messages: Any = _ABSENT
    id: Any = _ABSENT
    name: Any = _ABSENT
    max_tokens: Any = USER_MAX_TOKENS
    workload: Any = USER_WORKLOAD

    @classmethod
    def parse(cls, obj: Any) -> "_UserPrompt":
        """The prompt, or _Invalid saying what is wrong with it."""
        if not isinstance(obj, Mapping):
            raise _Invalid(f"expected a JSON object, got {type(obj).__name__}")
        unknown = sorted(set(obj) - _USER_KEYS)
        if unknown:
            raise _Invalid(f"unknown keys {unknown}; allowed: {sorted(_USER_KEYS)}")
        line = cls(**obj)
        line._check()
        return line

    def _check(self) -> None:
        if (self.prompt is _ABSENT) == (self.messages is _ABSENT):
            raise _Invalid("each line needs exactly one of 'prompt' or 'messages'")
        if self.prompt is not _ABSENT:
            if not isinstance(self.prompt, str) or not self.prompt.strip():
                raise _Invalid("'prompt' must be a non-empty string")
        else:
            problem = _check_messages(self.messages)
            if problem:
                raise _Invalid(problem)
        max_tokens = self.max_tokens
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens <= 0:
            raise _Invalid(f"'max_tokens' must be a positive integer, got {max_tokens!r}")
        workload = self.workload
        if not isinstance(workload, str) or not _WORKLOAD_NAME.match(workload):
            raise _Invalid(f"'workload' must be a name of letters, digits, '_', '.', '-', got {workload!r}")
        given = self.given_ids
        if len(given) == 2 and given[0] != given[1]:
            raise _Invalid("give 'id' or 'name', not two different ones")
        if given and (not isinstance(given[0], str) or not given[0].strip()):
            raise _Invalid(f"'id'/'name' must be a non-empty string, got {given[0]!r}")

    @property
    def given_ids(self) -> list[Any]:
        """`id` and `name` as given (either names the prompt)."""
        return [value for value in (self.id, self.name) if value is not _ABSENT]

    @property
    def chat(self) -> list[dict]:
        """The prompt as chat messages: a plain `prompt` is one user message."""
        if self.prompt is not _ABSENT:
            return [{"role": "user", "content": self.prompt}]
        return [{"role": m.role, "content": m.content} for m in map(_Message.of, self.messages)]


@dataclass(frozen=True)
class _Normalised:
    """A user prompt in the one form normalise_user_prompts gives (as a dict, itself a valid input line)."""

    id: str
    workload: str
    max_tokens: int
    messages: list[dict[str, Any]]   # [{"role", "content"}, ...]


def normalise_user_prompts(rows: Iterable[tuple[int, Any]], source: str | Path) -> list[dict]:
    """Validate user prompt objects and bring them to one form:
    {"id", "workload", "max_tokens", "messages": [{"role", "content"}, ...]}.

    That form is itself a valid input line, so normalising twice changes nothing. Ids default to
    f"{workload}-{index within workload}", like the built-in ones.
    """
    return [asdict(prompt) for prompt in _normalised(rows, source)]


def _normalised(rows: Iterable[tuple[int, Any]], source: str | Path) -> list[_Normalised]:
    out: list[_Normalised] = []
    seen_ids: dict[str, int] = {}
    per_workload: dict[str, int] = {}
    for lineno, obj in rows:
        try:
            line = _UserPrompt.parse(obj)
        except _Invalid as problem:
            raise PromptFileError(source, lineno, str(problem)) from None
        index = per_workload.get(line.workload, 0)
        per_workload[line.workload] = index + 1
        given = line.given_ids
        prompt_id = given[0] if given else f"{line.workload}-{index}"
        if prompt_id in seen_ids:
            raise PromptFileError(source, lineno, f"duplicate id {prompt_id!r} (first used at line {seen_ids[prompt_id]})")
        seen_ids[prompt_id] = lineno

        out.append(_Normalised(prompt_id, line.workload, line.max_tokens, line.chat))
    return out


def load_user_prompts(path: str | Path) -> list[dict]:
    """Read a --prompts JSONL file into normalised prompt dicts (see normalise_user_prompts).

    Each non-blank line is {"prompt": "..."} or {"messages": [{"role", "content"}, ...]}, with
    optional "id" (or "name"), "max_tokens" (default 256) and "workload" (default "user").
    Raises PromptFileError naming the file and line for anything wrong, including an empty file.
    """
    rows = read_jsonl(Path(path))
    if not rows:
        raise PromptFileError(path, None, "empty file: no prompts")
    return normalise_user_prompts(rows, path)


def user_prompt_specs(tokenizer, user_prompts: Sequence[Mapping[str, Any]],
                       builtin_names: Iterable[str]) -> list[PromptSpec]:
    normalised = _normalised(((i + 1, p) for i, p in enumerate(user_prompts)), "user_prompts")
    clashes = sorted({p.workload for p in normalised} & set(builtin_names))
    if clashes:
        raise ValueError(f"user prompt workloads {clashes} clash with built-in workload names")
    specs = []
    for p in normalised:
        _, ids = render_messages(tokenizer, p.messages)
        specs.append(PromptSpec(p.id, p.workload, "user", decode(tokenizer, ids), tuple(ids), p.max_tokens, None))
    return specs

