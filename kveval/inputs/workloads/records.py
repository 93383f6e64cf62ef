"""The prompt records every cell is given (PromptSpec), and the error a bad prompt file raises."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping


@dataclass(frozen=True)
class PromptSpec:
    id: str                      # unique, stable: f"{workload}-{index}" unless a user file names it
    workload: str                # group name, e.g. "short_256", "ctx_90pct", "over_4096", "user"
    kind: str                    # "short" | "probe" | "context" | "over_limit" | "user"
    text: str                    # tokenizer.decode(token_ids), special tokens kept
    token_ids: tuple[int, ...]   # what the engine gets
    max_tokens: int
    target_tokens: int | None    # prompt size asked for; None for short and user prompts

    def __post_init__(self) -> None:
        # Accept lists (e.g. from JSON) but store a tuple so the record stays hashable/immutable.
        object.__setattr__(self, "token_ids", tuple(int(t) for t in self.token_ids))

    def to_dict(self) -> dict:
        d = asdict(self)
        d["token_ids"] = list(self.token_ids)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "PromptSpec":
        required = ("id", "workload", "kind", "text", "token_ids", "max_tokens")
        missing = [k for k in required if k not in d]
        if missing:
            raise ValueError(f"PromptSpec.from_dict: missing keys {missing}")
        return cls(
            id=d["id"], workload=d["workload"], kind=d["kind"], text=d["text"],
            token_ids=tuple(d["token_ids"]), max_tokens=int(d["max_tokens"]),
            target_tokens=d.get("target_tokens"),
        )


class PromptFileError(ValueError):
    """A prompt file (or in-memory prompt list) is invalid; the message names file and line."""

    def __init__(self, path: str | Path, line: int | None, reason: str):
        self.path = str(path)
        self.line = line
        self.reason = reason
        where = f"{self.path}:{line}" if line is not None else self.path
        super().__init__(f"{where}: {reason}")

