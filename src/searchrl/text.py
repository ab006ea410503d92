"""Answer normalisation, one definition for the reward, the evaluation and the data checks.

`normalize_answer` is the SQuAD / Search-R1 exact-match normalisation
(`white_space_fix(remove_articles(remove_punc(lower(s))))`), so a data check that calls two
answers "the same" agrees with how the reward and the evaluation score them.
"""

from __future__ import annotations

import re
import string

_PUNCT = str.maketrans("", "", string.punctuation)
_ARTICLES = frozenset({"a", "an", "the"})
_ARTICLE_RE = re.compile(r"\b(a|an|the)\b")


def normalize_answer(text: str) -> str:
    """Lower-case, drop ASCII punctuation, drop the articles a/an/the, collapse whitespace.

    Exactly SQuAD's regex semantics, computed per whitespace token: a token of word
    characters only is an article or not as a whole, which is the fast path (the corpus scan
    normalises every passage); only tokens holding other characters (e.g. "o’the", "a–b")
    need the regex.
    """
    out: list[str] = []
    for token in text.lower().translate(_PUNCT).split():
        if token.isalnum():
            if token not in _ARTICLES:
                out.append(token)
        else:
            out.extend(_ARTICLE_RE.sub(" ", token).split())
    return " ".join(out)


def is_subspan(short: str, long: str) -> bool:
    """True when `short` is a non-empty whole-token contiguous span of `long`.

    Both arguments must already be normalised; "1919" is a sub-span of "year 1919",
    "191" is not.
    """
    return bool(short) and f" {short} " in f" {long} "
