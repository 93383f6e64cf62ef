"""A tiny duck-typed tokenizer for unit tests: one token per character, BOS = 1, no chat template.

Every word costs several tokens, so size tolerances and prompt framing are exercised without a
real model.
"""
from __future__ import annotations


class CharTokenizer:
    chat_template = None
    BOS = 1

    def _encode(self, text, add_special_tokens):
        ids = [ord(c) + 10 for c in text]
        return [self.BOS] + ids if add_special_tokens else ids

    def __call__(self, text, add_special_tokens=True):
        if isinstance(text, list):
            return {"input_ids": [self._encode(t, add_special_tokens) for t in text]}
        return {"input_ids": self._encode(text, add_special_tokens)}

    def decode(self, ids, skip_special_tokens=False, clean_up_tokenization_spaces=None):
        return "".join("<s>" if i == self.BOS else chr(i - 10) for i in ids)
