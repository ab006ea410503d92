from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from searchrl.config import ConfigError, PipelineConfig, load_config

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_shipped_config_loads(path: Path) -> None:
    config = load_config(path)
    assert isinstance(config, PipelineConfig)


def test_real_gpu_config_validates_with_its_real_choices() -> None:
    config = load_config(Path("configs/qwen2.5-3b-8gpu.yaml"))
    assert config.model.kind == "pretrained" and "Qwen2.5-3B" in (config.model.name_or_path or "")
    assert config.rollout.backend == "vllm" and config.train.zero_stage == 2
    assert config.index.retriever == "dense" and "e5" in config.index.encoder


def test_typo_key_names_file_key_and_options(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("train:\n  stpes: 3\n")
    with pytest.raises(ConfigError) as info:
        load_config(bad)
    message = str(info.value)
    assert str(bad) in message
    assert "train.stpes" in message
    assert "did you mean 'steps'" in message
    assert "questions_per_step" in message  # lists the valid keys of that section


def test_unknown_section_is_rejected(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("trian:\n  steps: 3\n")
    with pytest.raises(ConfigError, match="did you mean 'train'"):
        load_config(bad)


def test_bad_literal_names_valid_options(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("index:\n  retriever: bm52\n")
    with pytest.raises(ConfigError) as info:
        load_config(bad)
    assert "index.retriever" in str(info.value)
    assert "'bm25'" in str(info.value) and "'hybrid'" in str(info.value)


def test_overrides_apply_and_are_typed() -> None:
    config = load_config("configs/tiny.yaml", ["train.steps=3", "rollout.temperature=0.7",
                                               "run.work_dir=/tmp/x"])
    assert config.train.steps == 3
    assert config.rollout.temperature == pytest.approx(0.7)
    assert config.run.work_dir == Path("/tmp/x")


def test_bad_override_is_rejected() -> None:
    with pytest.raises(ConfigError, match=r"train\.steps"):
        load_config("configs/tiny.yaml", ["train.steps=many"])
    with pytest.raises(ConfigError, match=r"expected key\.sub=value"):
        load_config("configs/tiny.yaml", ["train.steps"])


def test_config_is_frozen() -> None:
    config = load_config("configs/tiny.yaml")
    with pytest.raises(Exception, match="frozen"):
        config.train.steps = 5  # type: ignore[misc]


def test_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nope\.yaml: config file not found"):
        load_config(tmp_path / "nope.yaml")


def test_fingerprint_of_tracks_only_what_the_result_reads() -> None:
    a = load_config("configs/tiny.yaml")
    b = load_config("configs/tiny.yaml", ["train.steps=7"])
    assert a.fingerprint_of("validate_gold_labels") == b.fingerprint_of("validate_gold_labels")
    assert a.fingerprint_of("train_policy") != b.fingerprint_of("train_policy")


# --- data set names become file names: checked at load, one rule (paths.safe_filename)


def _load_data(tmp_path: Path, **data: object) -> PipelineConfig:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"data": {
        "source": "files", "train_path": "t.jsonl", "test_path": "e.jsonl",
        "corpus_path": "c.jsonl", **data}}))
    return load_config(path)


@pytest.mark.parametrize(("names", "says"), [
    (["../escape"], "'../escape' is not a plain name"),
    (["/etc/x"], "'/etc/x' is not a plain name"),
    (["a/b"], "'a/b' is not a plain name"),
    (["a:b"], "'a:b' is not a plain name"),  # would share a_b's file
    (["nq.dev"], "'nq.dev' is not a plain name"),
    ([""], "'' is empty"),
    (["main"], "'main' is reserved"),  # would replace the main corpus
    (["test"], "'test' is reserved"),
    (["NQ", "nq"], "'NQ' and 'nq' differ only in case"),
])
@pytest.mark.parametrize("section", ["extra_eval", "extra_corpus"])
def test_data_set_names_are_checked_at_load(tmp_path: Path, section: str, names: list[str],
                                            says: str) -> None:
    with pytest.raises(ConfigError) as info:
        _load_data(tmp_path, **{section: dict.fromkeys(names, "x.jsonl")})
    assert f"data.{section}" in str(info.value) and says in str(info.value)


def test_plain_data_set_names_load(tmp_path: Path) -> None:
    config = _load_data(tmp_path, extra_eval={"hotpotqa": "q.jsonl", "2wiki-dev_1": "w.jsonl"},
                        extra_corpus={"hotpotqa": "c.jsonl"})
    assert set(config.data.extra_eval) == {"hotpotqa", "2wiki-dev_1"}


# --- settings under which training learns nothing (or cannot run) are rejected at load


@pytest.mark.parametrize(("override", "says"), [
    ("train.steps=0", "train.steps=0"),
    ("train.questions_per_step=0", "train.questions_per_step=0"),
    ("train.lr=0", "train.lr=0"),
    ("train.lr=-1e-4", "train.lr=-0.0001"),
    ("train.lr=.inf", "train.lr=inf"),
    ("train.micro_batch_size=0", "train.micro_batch_size=0"),
    ("train.clip_eps=0", "train.clip_eps=0"),
    ("train.kl_coef=-0.1", "train.kl_coef=-0.1"),
    ("train.weight_decay=-1", "train.weight_decay=-1"),
    ("train.checkpoint_every=-1", "train.checkpoint_every=-1"),
    ("train.keep_checkpoints=0", "train.keep_checkpoints=0"),
    ("train.max_nonfinite_steps=-1", "train.max_nonfinite_steps=-1"),
    ("train.grad_clip=-1", "train.grad_clip=-1"),
    ("train.sft.epochs=0", "train.sft.epochs=0"),
    ("train.sft.lr=0", "train.sft.lr=0"),
    ("train.sft.batch_size=0", "train.sft.batch_size=0"),
    ("train.sft.grad_clip=0", "train.sft.grad_clip=0"),
    ("train.sft.max_len=0", "train.sft.max_len=0"),
    ("curriculum.samples_per_question=1", "curriculum.samples_per_question=1"),
    ("curriculum.min_pass_rate=-0.1", "curriculum.min_pass_rate=-0.1"),
    ("curriculum.max_pass_rate=1.5", "curriculum.max_pass_rate=1.5"),
    ("curriculum.reestimate_every=-1", "curriculum.reestimate_every=-1"),
    ("curriculum.max_questions=0", "curriculum.max_questions=0"),
    ("rollout.group_size=1", "rollout.group_size=1"),
])
def test_settings_that_learn_nothing_are_rejected_naming_the_key(override: str,
                                                                 says: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config("configs/tiny.yaml", [override])
    assert says in str(info.value)


def test_pass_rate_band_must_not_be_empty() -> None:
    with pytest.raises(ConfigError, match=r"curriculum.min_pass_rate=0.8 is above "
                                          r"curriculum.max_pass_rate=0.2"):
        load_config("configs/tiny.yaml", ["curriculum.min_pass_rate=0.8",
                                          "curriculum.max_pass_rate=0.2"])
    # Off switches stay allowed: no checkpoints, no SFT epochs when the cold start is off
    # (a pretrained model: a tiny one cannot skip it).
    config = load_config("configs/tiny.yaml", ["train.checkpoint_every=0", "train.grad_clip=0",
                                               "train.sft.enabled=false", "train.sft.epochs=0",
                                               "model.kind=pretrained",
                                               "model.name_or_path=Qwen/Qwen2.5-0.5B"])
    assert config.train.checkpoint_every == 0 and not config.train.sft.enabled


def test_a_tiny_model_cannot_skip_the_cold_start() -> None:
    """A from-scratch tiny model has nothing to start RL from without SFT; the cold start
    always ran it regardless, so `train.sft.enabled: false` was silently ignored."""
    with pytest.raises(ConfigError, match=r"train.sft.enabled=false.*model.kind=tiny"):
        load_config("configs/tiny.yaml", ["train.sft.enabled=false"])
    pretrained = load_config("configs/tiny.yaml", ["train.sft.enabled=false",
                                                   "model.kind=pretrained",
                                                   "model.name_or_path=Qwen/Qwen2.5-0.5B"])
    assert not pretrained.train.sft.enabled
