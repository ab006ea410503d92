"""Stage 2: index the corpora (BM25 / dense / hybrid), scan them for poisoning, measure recall."""

from __future__ import annotations

from pathlib import Path

from prefect import task

from searchrl.config import PipelineConfig
from searchrl.data.sources import source_fingerprint
from searchrl.paths import StagePaths
from searchrl.retrieval.index_store import MAIN_CORPUS, build_indexes
from searchrl.tracking import stage_run
from searchrl.types import DatasetRef, IndexRef
from tasks._common import TASK_DEFAULTS, stage_cache_policy

EXTRA_EVAL = "extra_eval:"


def corpora_of(dataset: DatasetRef) -> tuple[dict[str, Path], dict[str, dict[str, Path]]]:
    """(corpus name -> corpus file, corpus name -> {eval set name -> QA file}).

    The main corpus is measured on the dev/test splits; each extra eval set `extra_eval:<n>`
    on its own corpus, materialised by validation next to the main one as
    `extra_corpus_<n>.jsonl`.
    """
    main = Path(dataset.corpus_path)
    corpora = {MAIN_CORPUS: main}
    evals: dict[str, dict[str, Path]] = {
        MAIN_CORPUS: {s: Path(dataset.paths[s]) for s in ("dev", "test") if s in dataset.paths}}
    for key, qa_path in sorted(dataset.paths.items()):
        if not key.startswith(EXTRA_EVAL):
            continue
        name = key.removeprefix(EXTRA_EVAL)
        corpus = main.parent / f"extra_corpus_{name}.jsonl"
        if not corpus.is_file():
            raise FileNotFoundError(f"{corpus}: no corpus for eval set {key!r}; set "
                                    f"data.extra_corpus.{name} in the config")
        corpora[name] = corpus
        evals[name] = {name: Path(qa_path)}
    return corpora, evals


# The extra corpora are not in DatasetRef's fingerprint, so the data sources' own fingerprint
# is part of the cache key: an edited corpus file re-indexes.
@task(name="build_index",
      cache_policy=stage_cache_policy("build_index", ("index",),
                                      extra=lambda c: source_fingerprint(c.data)),
      **TASK_DEFAULTS)
def build_index(config: PipelineConfig, dataset: DatasetRef, tracking_uri: str | None,
                parent_run_id: str | None) -> IndexRef:
    stage_dir = StagePaths(config.run.work_dir).index_dir
    with stage_run(tracking_uri, parent_run_id, "build_index") as sink:
        sink.log_params(config.to_dict()["index"])
        corpora, evals = corpora_of(dataset)
        fingerprint, results = build_indexes(corpora, evals, stage_dir, config.index, sink)
        sink.log_metrics({"passages": float(sum(r.passages for r in results)),
                          "build_seconds": sum(r.build_seconds for r in results),
                          "index_bytes": float(sum(r.index_bytes for r in results))})
        sink.log_artifact(stage_dir / "report.json", "index")
        sink.set_tags({"index.fingerprint": fingerprint, "index.retriever": config.index.retriever})
        return IndexRef(index_dir=str(stage_dir), fingerprint=fingerprint,
                        retriever=config.index.retriever, mlflow_run_id=sink.run_id)
