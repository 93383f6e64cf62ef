"""Encoding and chat rendering: text to the token ids an engine is given, the way vLLM's chat path renders
them, with the run's chat-template arguments (`with_chat_template_kwargs`).

The tokenizer is duck-typed as a Hugging Face tokenizer: `tokenizer(text_or_list, add_special_tokens=...)
["input_ids"]`, `tokenizer.decode(ids, ...)`, `tokenizer.apply_chat_template(...)` and `chat_template`.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

# Stands where the document goes while the chat template is rendered; never appears in real text.
_PLACEHOLDER = "\u27e6KVEVAL-DOCUMENT\u27e7"


def _has_chat_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def encode(tokenizer, text: str, add_special_tokens: bool = False) -> list[int]:
    """Token ids of `text`; by default without the special tokens (e.g. BOS) plain text would get."""
    if not text and not add_special_tokens:
        return []
    return list(tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"])


def encode_batch(tokenizer, texts: Sequence[str], add_special_tokens: bool = False) -> list[list[int]]:
    """Token ids of each of `texts`, in one tokenizer call (fast tokenizers encode a batch in parallel)."""
    return [list(ids) for ids in tokenizer(list(texts), add_special_tokens=add_special_tokens)["input_ids"]]


def decode(tokenizer, ids: Sequence[int]) -> str:
    """The text of `ids` for humans and reports: special tokens kept (they are part of what the model
    sees), spaces not "cleaned up"."""
    return tokenizer.decode(list(ids), skip_special_tokens=False,
                            clean_up_tokenization_spaces=False)


class ChatTemplateTokenizer:
    """A tokenizer whose every chat rendering passes the run's chat-template arguments (`kveval compare
    --chat-template-kwargs`, vLLM's `chat_template_kwargs`), e.g. {"enable_thinking": false} for a
    thinking template. Everything else is the wrapped tokenizer's, so the parent's prompts, its task data
    and the worker's lm-eval prompts (worker/lmeval_lm) all render through `_apply_template` alike."""

    def __init__(self, tokenizer, chat_template_kwargs: Mapping[str, Any]):
        self.tokenizer = tokenizer
        self.chat_template_kwargs = dict(chat_template_kwargs)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "tokenizer":   # copy/pickle probe before __init__: no recursion
            raise AttributeError(name)
        return getattr(self.tokenizer, name)

    def __call__(self, *args, **kwargs):
        return self.tokenizer(*args, **kwargs)

    def apply_chat_template(self, conversation, **kwargs):
        return self.tokenizer.apply_chat_template(conversation, **{**self.chat_template_kwargs, **kwargs})


def with_chat_template_kwargs(tokenizer, chat_template_kwargs: Mapping[str, Any] | None):
    """`tokenizer`, rendering chats with these template arguments (in place of any it had); the bare
    tokenizer when there are none."""
    if isinstance(tokenizer, ChatTemplateTokenizer):
        tokenizer = tokenizer.tokenizer
    return ChatTemplateTokenizer(tokenizer, chat_template_kwargs) if chat_template_kwargs else tokenizer


def _apply_template(tokenizer, messages: list[dict]) -> str:
    # A ChatTemplateTokenizer adds the run's chat-template arguments (with_chat_template_kwargs).
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def render_messages(tokenizer, messages: Sequence[Mapping[str, str]]) -> tuple[str, list[int]]:
    """Render a conversation the way vLLM's chat path does and return (text, token ids).

    With a chat template: apply it (generation prompt added) and tokenise WITHOUT adding special
    tokens, because the template already contains them. Without one, only a single user message
    makes sense: it is used as a plain prompt, tokenised WITH special tokens (e.g. BOS).
    """
    messages = [{"role": m["role"], "content": m["content"]} for m in messages]
    if _has_chat_template(tokenizer):
        text = _apply_template(tokenizer, messages)
        return text, encode(tokenizer, text)
    if len(messages) != 1 or messages[0]["role"] != "user":
        raise ValueError("the tokenizer has no chat template, so only a single user message "
                         "(or a plain 'prompt') can be used")
    text = messages[0]["content"]
    return text, encode(tokenizer, text, add_special_tokens=True)


def render_chat(tokenizer, user_text: str) -> tuple[str, list[int]]:
    """(text, token ids) for one user turn; see `render_messages` for the rule."""
    return render_messages(tokenizer, [{"role": "user", "content": user_text}])


def _special_tokens_around(tokenizer) -> tuple[list[int], list[int]]:
    """Tokens that add_special_tokens=True puts before and after plain text (e.g. [BOS], [])."""
    plain = encode(tokenizer, "a")
    full = encode(tokenizer, "a", add_special_tokens=True)
    for start in range(len(full) - len(plain) + 1):
        if full[start:start + len(plain)] == plain:
            return full[:start], full[start + len(plain):]
    return full[:len(full) - len(plain)], []   # odd tokenizer: assume everything extra leads


def context_frame(tokenizer, question: str) -> tuple[list[int], list[int]]:
    """Token ids that go before and after the document in a "<document>\\n\\n<question>" turn.

    The template is rendered once with a placeholder where the document goes, and the two sides
    are tokenised separately, so the document can then be given an exact number of tokens.
    """
    user_text = f"{_PLACEHOLDER}\n\n{question}"
    if _has_chat_template(tokenizer):
        rendered = _apply_template(tokenizer, [{"role": "user", "content": user_text}])
        if rendered.count(_PLACEHOLDER) != 1:
            raise ValueError("the chat template altered or repeated the user message; "
                             "cannot place a document in it")
        prefix, suffix = rendered.split(_PLACEHOLDER)
        return encode(tokenizer, prefix), encode(tokenizer, suffix)
    head, tail = _special_tokens_around(tokenizer)
    prefix, suffix = user_text.split(_PLACEHOLDER)
    return head + encode(tokenizer, prefix), encode(tokenizer, suffix) + tail

