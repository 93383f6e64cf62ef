"""The needle tasks: passkey, the three needle-in-a-haystack variants and variable tracking. Each generator
takes (tokenizer, its task's haystack `Source`, rng, target, depth) and returns (text, tokens, needle depths,
expected outputs)."""
from __future__ import annotations

import random
from pathlib import Path

from kveval.inputs.task_data.haystack import Needle, Source, haystack_doc
from kveval.inputs.workloads import load_corpus

PASSKEY_FILLER = ("The grass is green. The sky is blue. The sun is yellow. Here we go. "
                  "There and back again.")
PASSKEY_NEEDLE = "The pass key is {key}. Remember it. {key} is the pass key."
PASSKEY_INTRO = ("There is an important piece of information hidden inside a lot of irrelevant "
                 "text. Find it and memorize it. I will quiz you about it afterwards.")
PASSKEY_QUESTION = "What is the pass key? Answer with the pass key only."

NIAH_NEEDLE = "One of the special magic numbers for {key} is: {value}."
NIAH_INTRO = ("Some special magic numbers are hidden within the following text. Make sure to "
              "memorize them. I will quiz you about the numbers afterwards.")
NIAH_QUESTION = ("What is the special magic number for {key} mentioned in the provided text? "
                 "Answer with the number only.")
NIAH_MULTIVALUE_QUESTION = ("What are all the special magic numbers for {key} mentioned in the "
                            "provided text? Answer with the numbers only.")

VT_INTRO = "Memorize and track the chain of variable assignments hidden in the following text."
VT_QUESTION = ("Find all variables that are assigned the value {value} in the text above. "
               "Answer with the variable names only.")

# Needle keys are adjective-noun pairs ("quiet-harbor"); none of these pairs occur in the corpus.
_ADJECTIVES = ("quiet", "amber", "brisk", "hollow", "silver", "crooked", "gentle", "frozen",
               "golden", "narrow", "restless", "scarlet", "humble", "distant", "velvet", "rusty",
               "eager", "misty", "bold", "lucky", "sleepy", "wooden", "bright", "ancient")
_NOUNS = ("harbor", "lantern", "meadow", "compass", "falcon", "orchard", "anchor", "canyon",
          "willow", "beacon", "pebble", "thimble", "glacier", "kettle", "saddle", "quarry",
          "violin", "marble", "tunnel", "ember", "walrus", "feather", "garnet", "hammock")



def _seven_digits(rng: random.Random, used: set[str]) -> str:
    while True:
        value = str(rng.randint(1_000_000, 9_999_999))
        if value not in used:
            used.add(value)
            return value


def _keys(rng: random.Random, n: int) -> list[str]:
    return rng.sample([f"{a}-{b}" for a in _ADJECTIVES for b in _NOUNS], n)


def _var_names(rng: random.Random, n: int) -> list[str]:
    names: list[str] = []
    while len(names) < n:
        name = "".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ") for _ in range(5))
        if name not in names:
            names.append(name)
    return names


def passkey(tokenizer, filler: Source, rng, target, depth):
    key = str(rng.randint(10_000, 99_999))
    needles = [Needle(PASSKEY_NEEDLE.format(key=key), depth)]
    text, tokens, depths = haystack_doc(tokenizer, filler, target, 0,
                                         PASSKEY_INTRO, PASSKEY_QUESTION, needles)
    return text, tokens, depths, [key]


def niah_single(tokenizer, essay: Source, rng, target, depth):
    key, = _keys(rng, 1)
    value = _seven_digits(rng, set())
    needles = [Needle(NIAH_NEEDLE.format(key=key, value=value), depth)]
    return _essay(tokenizer, essay, rng, target, NIAH_INTRO,
                  NIAH_QUESTION.format(key=key), needles) + ([value],)


def niah_multikey(tokenizer, essay: Source, rng, target, depth):
    keys = _keys(rng, 4)
    used: set[str] = set()
    values = [_seven_digits(rng, used) for _ in keys]
    needles = [Needle(NIAH_NEEDLE.format(key=keys[0], value=values[0]), depth)]
    needles += [Needle(NIAH_NEEDLE.format(key=k, value=v), rng.random())
                for k, v in zip(keys[1:], values[1:])]
    return _essay(tokenizer, essay, rng, target, NIAH_INTRO,
                  NIAH_QUESTION.format(key=keys[0]), needles) + ([values[0]],)


def niah_multivalue(tokenizer, essay: Source, rng, target, depth):
    key, = _keys(rng, 1)
    used: set[str] = set()
    values = [_seven_digits(rng, used) for _ in range(4)]
    needles = [Needle(NIAH_NEEDLE.format(key=key, value=values[0]), depth)]
    needles += [Needle(NIAH_NEEDLE.format(key=key, value=v), rng.random()) for v in values[1:]]
    return _essay(tokenizer, essay, rng, target, NIAH_INTRO,
                  NIAH_MULTIVALUE_QUESTION.format(key=key), needles) + (values,)


def vt(tokenizer, essay: Source, rng, target, depth):
    names = _var_names(rng, 5)
    value = str(rng.randint(10_000, 99_999))
    hops = sorted(rng.uniform(depth, 1.0) for _ in names[1:])
    needles = [Needle(f"VAR {names[0]} = {value}.", depth)]
    needles += [Needle(f"VAR {names[i + 1]} = VAR {names[i]}.", hop, after=i)
                for i, hop in enumerate(hops)]
    return _essay(tokenizer, essay, rng, target, VT_INTRO,
                  VT_QUESTION.format(value=value), needles) + (names,)


def _essay(tokenizer, essay: Source, rng, target, intro, question, needles):
    first = rng.randrange(len(essay.paragraphs))
    return haystack_doc(tokenizer, essay, target, first, intro, question, needles)



def passkey_sources(tokenizer, data_dir: Path) -> Source:
    """The passkey haystack: one filler paragraph, tokenised once per call."""
    del data_dir
    return Source(tokenizer, [PASSKEY_FILLER], " ")


def essay_sources(tokenizer, data_dir: Path) -> Source:
    """The essay haystack of the niah and vt tasks: the corpus, tokenised once per call."""
    return Source(tokenizer, load_corpus(Path(data_dir)), "\n\n")
