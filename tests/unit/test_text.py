"""The one answer normaliser (SQuAD / Search-R1 EM) and the whole-token sub-span test."""

from __future__ import annotations

import random
import re
import string

import pytest

from searchrl.text import is_subspan, normalize_answer


@pytest.mark.parametrize(("raw", "norm"), [
    ("The  Tornis!", "tornis"), ("an Apple, a day", "apple day"), ("  MIXED case ", "mixed case"),
    ("théâtre", "théâtre"), ("", ""), ("The Year 1919.", "year 1919"),
    ("An  apple, a DAY!", "apple day"), ("6,960", "6960"), ("theatre", "theatre"),
    ("the-end", "theend"),  # punctuation goes first, so "the-end" is one token
    ("o’the a–b", "o’ –b"),  # non-ASCII non-word characters are word boundaries, as in SQuAD
])
def test_normalize_answer(raw: str, norm: str) -> None:
    assert normalize_answer(raw) == norm


def _squad(s: str) -> str:
    """SQuAD v1.1's reference normalisation, verbatim in substance."""
    s = "".join(ch for ch in s.lower() if ch not in set(string.punctuation))
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", s).split())


def test_normalize_answer_equals_squad_reference_on_random_text() -> None:
    rng = random.Random(0)
    alphabet = "aAnNtThHeE xy1_-’–\x00\x1c\t\n.,'éßİ\u00a0\u2009"
    for _ in range(20_000):
        s = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12)))
        assert normalize_answer(s) == _squad(s), repr(s)


def test_is_subspan_whole_tokens_only() -> None:
    assert is_subspan("1919", "year 1919")
    assert is_subspan("year 1919", "year 1919")
    assert not is_subspan("191", "year 1919")
    assert not is_subspan("", "year 1919")
