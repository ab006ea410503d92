"""Turn real Search-R1 / FlashRAG / raw-benchmark data into the pipeline's `source: files` inputs.

`prepare_data(spec, out_dir)` reads each QA source (layout given or detected from the first
row), maps it to QAExample rows (`hops`, `type`, `data_source`; `supporting_doc_ids` only
where they resolve in the corpus written next to them), mixes the train parts, streams the
corpus (wiki-18's 21M lines never sit in memory) and writes:

    train.jsonl, dev.jsonl (optional), eval_<name>.jsonl, corpus.jsonl  (each + manifest)
    data.yaml       the `data:` section that points the pipeline at these files
    prepared.json   counts, layouts, skipped rows (file/line/field); written LAST

A row without a question or answer is skipped and recorded, never dropped silently; an
unreadable source, or a corpus row without contents, raises DataError naming file and line.
prepared.json is removed first and written last, so a failed run never looks complete.

The package: `spec` (the spec YAML, the output names), `layouts` (benchmark rows -> QA rows,
QA sources read with skipped rows recorded), `corpus` (the streamed corpus writer), `build`
(`prepare_data`).
"""

from searchrl.datasets.prepare.build import PreparedData, prepare_data
from searchrl.datasets.prepare.layouts import SkippedRow, detect_layout
from searchrl.datasets.prepare.spec import (
    CORPUS,
    DATA_YAML,
    PREPARED,
    CorpusLayout,
    CorpusSpec,
    PrepareSpec,
    QALayout,
    QASourceSpec,
    TrainPartSpec,
    load_spec,
)

__all__ = ["CORPUS", "DATA_YAML", "PREPARED", "CorpusLayout", "CorpusSpec", "PrepareSpec",
           "PreparedData", "QALayout", "QASourceSpec", "SkippedRow", "TrainPartSpec",
           "detect_layout", "load_spec", "prepare_data"]
