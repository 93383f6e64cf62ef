"""Source text and the scoring documents cut from it: corpus paragraphs (data/corpus/) laid out as an endless
token stream, from which documents of an exact token count are taken."""
from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Sequence

from kveval.inputs.resources import DATA_DIR
from kveval.inputs.workloads.chat import encode, encode_batch


def load_corpus(data_dir: Path = DATA_DIR) -> list[str]:
    """Paragraphs of data/corpus/*.txt, files in name order, paragraphs split on blank lines."""
    files = sorted((Path(data_dir) / "corpus").glob("*.txt"))
    paragraphs = []
    for f in files:
        for block in re.split(r"\n\s*\n", f.read_text(encoding="utf-8")):
            para = " ".join(block.split())   # unwrap hard line breaks inside a paragraph
            if para:
                paragraphs.append(para)
    if not paragraphs:
        raise ValueError(f"no corpus paragraphs found in {Path(data_dir) / 'corpus'}/*.txt")
    return paragraphs



def _separator_ids(tokenizer) -> list[int]:
    """Tokens of the blank line between two paragraphs, as they come out in running text.

    Byte-level BPE tokenisers often encode a lone "\n\n" as one token but "end.\n\nNext" with
    two "\n" tokens; using the in-context form keeps decode -> re-encode close to the stream.
    """
    left, right = encode(tokenizer, "end."), encode(tokenizer, "Next")
    joint = encode(tokenizer, "end.\n\nNext")
    middle = joint[len(left):len(joint) - len(right)]
    if joint[:len(left)] == left and joint[len(joint) - len(right):] == right and middle:
        return middle
    return encode(tokenizer, "\n\n")


class DocumentStream:
    """An endless token stream over the corpus, for cutting documents of any length.

    Paragraphs are tokenised once, then laid out in an order shuffled by random.Random(seed),
    reshuffled on every pass (so 32K+ token documents do not repeat one fixed sequence), each
    followed by the tokens of a blank line. Documents start at paragraph boundaries, which keeps
    their beginnings readable; they end wherever the exact token count runs out.
    """

    def __init__(self, tokenizer, paragraphs: Sequence[str], seed: int):
        self._paragraph_ids = encode_batch(tokenizer, paragraphs)
        self._separator = _separator_ids(tokenizer)
        self._rng = random.Random(seed)
        self._tokens: list[int] = []
        self._paragraph_starts: list[int] = []   # stream offset of each laid-out paragraph
        self._last: int | None = None

    @property
    def paragraphs_per_pass(self) -> int:
        return len(self._paragraph_ids)

    def _lay_out_one_pass(self) -> None:
        order = list(range(len(self._paragraph_ids)))
        self._rng.shuffle(order)
        if len(order) > 1 and order[0] == self._last:   # no paragraph twice in a row across passes
            order[0], order[-1] = order[-1], order[0]
        for i in order:
            self._paragraph_starts.append(len(self._tokens))
            self._tokens.extend(self._paragraph_ids[i])
            self._tokens.extend(self._separator)
        self._last = order[-1]

    def take(self, paragraph: int, n_tokens: int) -> list[int]:
        """n_tokens tokens starting at the beginning of the paragraph-th laid-out paragraph."""
        while len(self._paragraph_starts) <= paragraph:
            self._lay_out_one_pass()
        start = self._paragraph_starts[paragraph]
        while len(self._tokens) < start + n_tokens:
            self._lay_out_one_pass()
        return self._tokens[start:start + n_tokens]


def document_tokens(tokenizer, n_tokens: int, *, seed: int = 0, data_dir: Path = DATA_DIR) -> list[int]:
    """Exactly n_tokens of plain corpus text (no chat template), for teacher-forced scoring.

    Starts with the tokenizer's own special prefix (e.g. BOS) when it adds one to plain text, so
    the model sees a normal document start.
    """
    prefix = [t for t in encode(tokenizer, "x", add_special_tokens=True) if t not in encode(tokenizer, "x")]
    stream = DocumentStream(tokenizer, load_corpus(Path(data_dir)), seed)
    first = random.Random(f"{seed}:document:{n_tokens}").randrange(stream.paragraphs_per_pass)
    body = stream.take(first, max(0, n_tokens - len(prefix)))
    return (prefix + body)[:n_tokens]
