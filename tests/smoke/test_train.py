"""The trainer with real DeepSpeed (CPU, gloo, ZeRO 0) on a tiny model: bit-for-bit resume,
non-finite handling, and one end-to-end step with the real rollout loop and BM25."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from searchrl.config import PipelineConfig
from searchrl.datasets.synthetic import generate_world
from searchrl.generation.base import SamplingParams
from searchrl.generation.hf import HFGenerator
from searchrl.rl.records import RolloutRecord
from searchrl.rl.rollout import RolloutBatch
from searchrl.train.grpo.checkpoint import CheckpointError
from searchrl.train.grpo.errors import TrainingError
from searchrl.train.grpo.trainer import train_grpo
from searchrl.types import QAExample
from tests.train_fixture import build_init_policy, fake_rollouts, tiny_config, train_examples

pytestmark = pytest.mark.smoke



def _config(tmp: Path, **train: Any) -> PipelineConfig:
    return tiny_config(tmp, **train)


@pytest.fixture(scope="module")
def init_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_init_policy(tmp_path_factory.mktemp("init") / "policy")


def _examples() -> list[QAExample]:
    return train_examples()


def _weights(out: Path) -> dict[str, torch.Tensor]:
    return load_file(str(out / "policy" / "model.safetensors"))


def test_resume_is_bit_for_bit(tmp_path: Path, init_dir: Path) -> None:
    cfg = _config(tmp_path)
    ex = _examples()
    full = train_grpo(cfg, ex, None, init_dir, tmp_path / "full",  # type: ignore[arg-type]
                      rollout_fn=fake_rollouts, progress=False)
    assert full.steps_done == 4 and len(full.losses) == 4
    part = train_grpo(cfg, ex, None, init_dir, tmp_path / "part",  # type: ignore[arg-type]
                      rollout_fn=fake_rollouts, progress=False, stop_after=2)
    assert part.steps_done == 2 and not (tmp_path / "part" / "policy").exists()
    resumed = train_grpo(cfg, ex, None, init_dir, tmp_path / "part",  # type: ignore[arg-type]
                         rollout_fn=fake_rollouts, progress=False)
    assert resumed.resumed_from == 2 and resumed.steps_done == 4
    assert resumed.losses == full.losses
    # The resumed run's time includes the first attempt's, up to the checkpoint it left.
    assert full.earlier_attempts_seconds == part.earlier_attempts_seconds == 0.0
    assert 0.0 < resumed.earlier_attempts_seconds <= part.seconds
    assert resumed.seconds > resumed.earlier_attempts_seconds
    a, b = _weights(tmp_path / "full"), _weights(tmp_path / "part")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # The policy moved away from its start (the test would pass vacuously otherwise).
    start = load_file(str(init_dir / "model.safetensors"))
    assert any(not torch.equal(a[k], start[k]) for k in start)
    lines = [json.loads(x) for x in (tmp_path / "part" / "metrics.jsonl").read_text().split("\n")
             if x]
    assert [x["step"] for x in lines] == [1, 2, 3, 4]
    for key in ("reward_mean", "reward_std", "correct_rate", "zero_variance_fraction",
                "searches_per_rollout", "format_rate", "response_tokens", "kl", "entropy",
                "clip_fraction", "mask_coverage", "time_generation_s", "time_retrieval_s",
                "time_ref_logprobs_s", "time_forward_s", "time_backward_s",
                "time_optimizer_s", "logprob_mismatch"):
        assert key in lines[-1], key
    assert 0 < lines[-1]["mask_coverage"] < 1  # inserted tokens are not policy tokens
    assert (tmp_path / "full" / "curve.png").stat().st_size > 0


def test_ppo_ptx_replays_demonstrations_each_step_and_resumes_bit_for_bit(
        tmp_path: Path, init_dir: Path) -> None:
    ptx = {"ptx_coef": 1.0, "ptx_worlds": 1, "ptx_demos": 12, "ptx_rows": 4}
    cfg, ex = _config(tmp_path, **ptx), _examples()
    train_grpo(_config(tmp_path), ex, None, init_dir,  # type: ignore[arg-type]
               tmp_path / "plain", rollout_fn=fake_rollouts, progress=False)
    full = train_grpo(cfg, ex, None, init_dir, tmp_path / "full",  # type: ignore[arg-type]
                      rollout_fn=fake_rollouts, progress=False)
    train_grpo(cfg, ex, None, init_dir, tmp_path / "part",  # type: ignore[arg-type]
               rollout_fn=fake_rollouts, progress=False, stop_after=2)
    resumed = train_grpo(cfg, ex, None, init_dir, tmp_path / "part",  # type: ignore[arg-type]
                         rollout_fn=fake_rollouts, progress=False)
    assert resumed.resumed_from == 2 and resumed.losses == full.losses
    a, b = _weights(tmp_path / "full"), _weights(tmp_path / "part")
    assert all(torch.equal(a[k], b[k]) for k in a)
    # The replay acts: the same rollouts give other weights than without it ...
    c = _weights(tmp_path / "plain")
    assert any(not torch.equal(a[k], c[k]) for k in a)
    # ... and the policy learns the replayed demonstrations (3 steps cycle all 12 rows).
    lines = [json.loads(x) for x in (tmp_path / "full" / "metrics.jsonl").read_text().splitlines()
             if x]
    nll = [x["ptx_nll"] for x in lines]
    assert len(nll) == 4 and nll[3] < nll[0] - 0.5, nll
    assert all(x["time_ptx_s"] > 0 for x in lines)
    assert "ptx_nll" not in json.loads(
        (tmp_path / "plain" / "metrics.jsonl").read_text().splitlines()[0])


class OwnCopyGenerator:
    """A rollout backend holding its own copy of the weights, as vLLM does: it sees training
    only through `update_weights`."""

    def __init__(self, config: Any, *, policy_dir: Path, model: torch.nn.Module,
                 tokenizer: Any) -> None:
        self.copy = copy.deepcopy(model)
        self.inner = HFGenerator(self.copy, tokenizer, "cpu")
        self.syncs = 0

    @property
    def tokenizer(self) -> Any:
        return self.inner.tokenizer

    @property
    def max_context_tokens(self) -> int | None:
        return self.inner.max_context_tokens

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        return self.inner.generate(*args, **kwargs)

    def release(self) -> None:
        self.inner.release()

    def update_weights(self, model: torch.nn.Module) -> None:
        self.copy.load_state_dict(model.state_dict())
        self.syncs += 1


def test_a_backend_with_its_own_weights_is_synced_every_step_and_on_resume(
        tmp_path: Path, init_dir: Path) -> None:
    cfg, ex = _config(tmp_path), _examples()
    made: list[OwnCopyGenerator] = []

    def factory(*args: Any, **kwargs: Any) -> OwnCopyGenerator:
        made.append(OwnCopyGenerator(*args, **kwargs))
        return made[-1]

    def run(out: str, **kw: Any) -> Any:
        return train_grpo(cfg, ex, None, init_dir, tmp_path / out,  # type: ignore[arg-type]
                          rollout_fn=fake_rollouts, progress=False, **kw)

    in_process = run("hf")
    synced = run("copy", generator_factory=factory)
    # Sampling from the copy gives exactly the in-process run: it always had the live weights.
    assert made[0].syncs == 4 and synced.losses == in_process.losses
    final = _weights(tmp_path / "copy")
    assert all(torch.equal(made[0].copy.state_dict()[k], final[k]) for k in final)
    run("resumed", generator_factory=factory, stop_after=2)
    resumed = run("resumed", generator_factory=factory)
    # The resumed run's fresh backend got the checkpoint's weights before its first rollout.
    assert resumed.resumed_from == 2 and made[-1].syncs == 1 + 2
    assert resumed.losses == in_process.losses


def test_checkpoints_of_a_different_run_are_moved_aside_not_resumed(
        tmp_path: Path, init_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    ex, out = _examples(), tmp_path / "run"
    first = train_grpo(_config(tmp_path), ex, None, init_dir, out,  # type: ignore[arg-type]
                       rollout_fn=fake_rollouts, progress=False, stop_after=2)
    assert first.steps_done == 2
    changed = _config(tmp_path, lr=5e-3)  # the work dir is the same, the run is not
    with caplog.at_level("WARNING"):
        second = train_grpo(changed, ex, None, init_dir, out,  # type: ignore[arg-type]
                            rollout_fn=fake_rollouts, progress=False, stop_after=2)
    assert second.resumed_from == 0 and "different run" in caplog.text
    aside = sorted(out.glob("checkpoints.superseded-*"))
    assert len(aside) == 1 and (aside[0] / "step_000002").is_dir()  # evidence kept
    # Only operational settings changed (more steps): that is the same run, it resumes.
    longer = train_grpo(_config(tmp_path, lr=5e-3, steps=6), ex, None,  # type: ignore[arg-type]
                        init_dir, out, rollout_fn=fake_rollouts, progress=False)
    assert longer.resumed_from == 2 and longer.steps_done == 6


def test_resume_refuses_when_every_checkpoint_is_corrupt(tmp_path: Path, init_dir: Path) -> None:
    cfg = _config(tmp_path)
    ex = _examples()
    train_grpo(cfg, ex, None, init_dir, tmp_path / "run",  # type: ignore[arg-type]
               rollout_fn=fake_rollouts, progress=False, stop_after=2)
    (ckpt,) = sorted((tmp_path / "run" / "checkpoints").glob("step_*"))
    (ckpt / "model.safetensors").write_bytes(b"truncated")
    with pytest.raises(CheckpointError, match="no checkpoint passes verification"):
        train_grpo(cfg, ex, None, init_dir, tmp_path / "run",  # type: ignore[arg-type]
                   rollout_fn=fake_rollouts, progress=False)
    assert ckpt.is_dir()  # the evidence is kept


def test_periodic_reestimate_retires_solved_questions(tmp_path: Path, init_dir: Path) -> None:
    base = _config(tmp_path, checkpoint_every=0)
    cfg = base.model_copy(update={"curriculum": base.curriculum.model_copy(
        update={"reestimate_every": 2})})
    ex = _examples()[:6]

    def always_right_on_q0(*args: Any, **kwargs: Any) -> RolloutBatch:
        batch = fake_rollouts(*args, **kwargs)
        for r in batch.records:
            if r.example_id == ex[0].id:
                r.correct = True
        return batch

    train_grpo(cfg, ex, None, init_dir, tmp_path / "re",  # type: ignore[arg-type]
               rollout_fn=always_right_on_q0, progress=False)
    lines = [json.loads(x) for x in (tmp_path / "re" / "metrics.jsonl").read_text().split("\n")
             if x]
    at2 = lines[1]
    assert at2["reestimate_solved_share"] >= 1 / 6
    assert at2["pool_size"] == 6 - at2["reestimate_retired"] and at2["reestimate_retired"] >= 1
    assert "reestimate_solved_share" not in lines[0]


def test_nonfinite_rewards_skip_then_abort(tmp_path: Path, init_dir: Path) -> None:
    cfg = _config(tmp_path, max_nonfinite_steps=1, checkpoint_every=0)

    def nan_rollouts(*args: Any, **kwargs: Any) -> RolloutBatch:
        return fake_rollouts(*args, **kwargs, reward_override=float("nan"))

    with pytest.raises(TrainingError, match="max_nonfinite_steps=1"):
        train_grpo(cfg, _examples(), None, init_dir, tmp_path / "nan",  # type: ignore[arg-type]
                   rollout_fn=nan_rollouts, progress=False)
    lines = (tmp_path / "nan" / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["skipped"] == 1.0
    assert not (tmp_path / "nan" / "policy").exists()


@pytest.mark.slow
def test_end_to_end_with_real_rollouts_bm25_and_cold_start(tmp_path: Path) -> None:
    from searchrl.config import IndexConfig
    from searchrl.datasets.world import write_world
    from searchrl.models.tiny import load_policy
    from searchrl.retrieval.bm25 import BM25Index
    from searchrl.retrieval.index_store import LocalSearcher
    from searchrl.train.cold_start.build import SFT_KEY_FILE, cold_start
    from searchrl.train.grpo.trainer import train_policy_run

    cfg = _config(tmp_path, steps=1, checkpoint_every=0, eval_every=1, eval_questions=3)
    cfg = cfg.model_copy(update={"train": cfg.train.model_copy(update={
        "sft": cfg.train.sft.model_copy(update={"n_demos": 24, "epochs": 1})})})
    world = generate_world(cfg.data.synthetic)
    paths = write_world(world, tmp_path / "data")
    searcher = LocalSearcher(world.passages, IndexConfig(retriever="bm25"),
                             bm25=BM25Index.build([p.contents for p in world.passages]))
    # The train stage prepares the start before any rank runs (train/start.py).
    sft = cold_start(cfg, world.splits["train"], world.passages, searcher, tmp_path / "out" / "sft")
    result = train_policy_run(cfg, paths["train"], paths["corpus"], searcher, sft,
                              tmp_path / "out", dev_path=paths["dev"], progress=False)
    assert result.steps_done == 1 and result.curve_path is not None
    model, tok = load_policy(result.policy_dir)
    assert "<search>" in tok.get_vocab() and model.config.num_hidden_layers == 1
    row = json.loads(result.metrics_path.read_text().splitlines()[0])
    assert {"dev_em", "dev_em_all", "rollout_tokens", "time_rollout_s"} <= row.keys()
    assert row["response_tokens"] > 0
    # The cold start is reused, not rebuilt, by a second call with the same inputs.
    key = result.sft_dir / SFT_KEY_FILE
    before = key.stat().st_mtime_ns
    cold_start(cfg, world.splits["train"], world.passages, searcher, result.sft_dir)
    assert key.stat().st_mtime_ns == before


@pytest.mark.slow
@pytest.mark.parametrize("stage", [1, 2])
def test_zero_stages_train_and_resume(tmp_path: Path, init_dir: Path, stage: int) -> None:
    cfg = _config(tmp_path, steps=2, checkpoint_every=1, zero_stage=stage)
    ex = _examples()
    first = train_grpo(cfg, ex, None, init_dir, tmp_path / "z",  # type: ignore[arg-type]
                       rollout_fn=fake_rollouts, progress=False, stop_after=1)
    assert first.steps_done == 1
    resumed = train_grpo(cfg, ex, None, init_dir, tmp_path / "z",  # type: ignore[arg-type]
                         rollout_fn=fake_rollouts, progress=False)
    assert resumed.resumed_from == 1 and resumed.steps_done == 2
    assert (tmp_path / "z" / "policy" / "model.safetensors").is_file()


def test_trainer_logprobs_use_the_sampling_temperature(init_dir: Path) -> None:
    """The sampler draws from softmax(logits / T); the trainer's log-probs must match it."""
    from searchrl.generation.hf import HFGenerator
    from searchrl.models.tiny import load_policy
    from searchrl.train.grpo.update import no_grad_logprobs
    from searchrl.train.tensors import pack_records

    model, tok = load_policy(init_dir)
    prompt = list(tok("Who founded it?", add_special_tokens=False)["input_ids"])
    params = SamplingParams(max_new_tokens=6, temperature=2.5)
    (out,) = HFGenerator(model, tok).generate([prompt], params, seed=1)
    record = RolloutRecord(example_id="x", sample_index=0, prompt_ids=prompt,
                           response_ids=out.token_ids, loss_mask=[1] * len(out.token_ids),
                           old_logprobs=out.logprobs, text="", turns=1, reward=0.0,
                           correct=False)
    packed = pack_records([record], torch.zeros(1), int(tok.pad_token_id))
    tempered = no_grad_logprobs(model, packed, 2.5)
    raw = no_grad_logprobs(model, packed, 1.0)
    m = packed.loss_mask.bool()
    assert torch.allclose(tempered[m], packed.old_logprobs[m], atol=1e-4)
    assert not torch.allclose(raw[m], packed.old_logprobs[m], atol=1e-2)


def test_deepspeed_init_compiles_no_shared_memory_op() -> None:
    """The CPU backend's shm all-reduce op (DeepSpeed inference only) is not JIT-built: that
    build cost ~30 s in every fresh environment before the first training step."""
    from deepspeed.comm import comm as ds_comm

    from searchrl.train.distributed.deepspeed_setup import init_distributed

    init_distributed("cpu")
    assert ds_comm.cdb is not None and ds_comm.cdb.shm_comm_op is None
