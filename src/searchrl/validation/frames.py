"""Flatten raw rows into the frames the GX suites check.

Nested or mixed-type fields (the answer list, an integer that may arrive as a string or a bool)
become plain derived columns, so every rule is a column-map expectation with a per-row verdict.
A derived "*_ok" column holds "ok" or the problem in words; the value columns hold the value
only when it has the right type (else None), so range checks never compare mixed types.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

OK = "ok"


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _answers_ok(answers: Any) -> str | None:
    if answers is None:
        return None  # the not-null rule on n_answers reports it
    if not isinstance(answers, list | tuple):
        return "not a list"
    if not all(isinstance(a, str) for a in answers):
        return "contains a non-string"
    return OK


def _str_list_ok(values: Any) -> str:
    if values is None:
        return OK
    if isinstance(values, list | tuple) and all(isinstance(v, str) for v in values):
        return OK
    return "not a list of strings"


def qa_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """Columns: id, question, n_answers, answers_ok, shortest_answer_chars,
    longest_answer_chars, hops, hops_ok, type, supporting_ok."""
    records = []
    for raw in rows:
        answers = raw.get("golden_answers")
        answers_ok = _answers_ok(answers)
        good = answers_ok == OK and isinstance(answers, list | tuple) and len(answers) > 0
        strs = [a for a in answers if isinstance(a, str)] if good and answers else []
        hops = raw.get("hops")
        records.append({
            "id": raw.get("id"),
            "question": raw.get("question"),
            # A value that is present but no list counts as one (not "required"): the
            # answers_ok rule names what is wrong with it.
            "n_answers": (len(answers) if isinstance(answers, list | tuple)
                          else None if answers is None else 1),
            "answers_ok": answers_ok,
            "shortest_answer_chars": min(len(a.strip()) for a in strs) if strs else None,
            "longest_answer_chars": max(len(a) for a in strs) if strs else None,
            "hops": hops if _is_int(hops) else None,
            "hops_ok": None if hops is None else (OK if _is_int(hops) else "not an integer"),
            "type": raw.get("type"),
            "supporting_ok": _str_list_ok(raw.get("supporting_doc_ids")),
        })
    columns = ["id", "question", "n_answers", "answers_ok", "shortest_answer_chars",
               "longest_answer_chars", "hops", "hops_ok", "type", "supporting_ok"]
    return pd.DataFrame.from_records(records, columns=columns).astype(object)


def corpus_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """Columns: id, title, contents (the values as they are, object dtype).

    Built column by column as object arrays: letting pandas infer its string dtype first
    (pyarrow-backed in pandas 3) and converting back cost more than the suite itself on a
    corpus chunk."""
    columns = {}
    for name in ("id", "title", "contents"):
        values = np.empty(len(rows), dtype=object)
        values[:] = [r.get(name) for r in rows]
        columns[name] = values
    return pd.DataFrame(columns, columns=["id", "title", "contents"], dtype=object, copy=False)
