"""Answer and question normalisation shared by every gold-label check.

`normalize_text` is the SQuAD / Search-R1 exact-match normalisation (lower case, punctuation
removed, articles a/an/the removed, whitespace collapsed), so a check that calls two answers
"the same" agrees with how the reward and the evaluation will score them.
"""

from __future__ import annotations

import re
import string

_PUNCT_TABLE = str.maketrans("", "", string.punctuation)
_ARTICLES = re.compile(r"\b(?:a|an|the)\b")


def normalize_text(text: str) -> str:
    """Lower-cased, punctuation- and article-free, single-spaced text (SQuAD EM normalisation)."""
    return " ".join(_ARTICLES.sub(" ", text.lower().translate(_PUNCT_TABLE)).split())


def tokens(text: str) -> list[str]:
    """Tokens of the normalised text."""
    return normalize_text(text).split()


def is_subspan(short: str, long: str) -> bool:
    """True when normalised `short` is a whole-token contiguous span of normalised `long`.

    Both arguments must already be normalised; "1919" is a sub-span of "year 1919",
    "191" is not.
    """
    return bool(short) and f" {short} " in f" {long} "
