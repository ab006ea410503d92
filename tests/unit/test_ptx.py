"""PPO-ptx replay (train/grpo/ptx.py): which demonstrations, which rows each optimizer step and rank
trains on, and a loss whose rank shares average to the single-process loss."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from searchrl.datasets.synthetic import generate_world
from searchrl.rl.prompts import ANSWER_OPEN
from searchrl.train.cold_start.build import extra_world_seeds
from searchrl.train.grpo.ptx import build_replay, ptx_loss, step_rows
from tests.train_fixture import build_init_policy, tiny_config

PTX = {"ptx_coef": 0.5, "ptx_worlds": 2, "ptx_demos": 12, "ptx_rows": 5}


@pytest.fixture(scope="module")
def policy(tmp_path_factory: pytest.TempPathFactory) -> tuple[object, object]:
    path = build_init_policy(tmp_path_factory.mktemp("init") / "policy")
    return AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)


def test_off_by_default() -> None:
    cfg = tiny_config(Path("/tmp"))
    assert cfg.train.ptx_coef == 0.0
    assert build_replay(cfg, None, ()) is None


def test_replays_gold_chains_of_worlds_the_cold_start_never_saw(policy: tuple) -> None:
    _, tokenizer = policy
    cfg = tiny_config(Path("/tmp"), **PTX)
    replay = build_replay(cfg, tokenizer, ())
    assert replay is not None and len(replay.rows) == 12 and replay.per_step == 5
    cold = set(extra_world_seeds(cfg))
    ptx = extra_world_seeds(cfg, first=cfg.train.sft.extra_worlds, count=2)
    assert len(ptx) == 2 and not cold & set(ptx) and cfg.data.synthetic.seed not in ptx
    # Gold chains only: every row searches, then answers (no baseline formats, which open
    # the answer right after the prompt or after one retrieval).
    for row in replay.rows:
        text = tokenizer.decode(row.input_ids)
        assert text.count("<search>") >= 1 and ANSWER_OPEN in text
        assert sum(row.loss_mask) > 0


def test_excluded_names_never_become_targets(policy: tuple) -> None:
    _, tokenizer = policy
    cfg = tiny_config(Path("/tmp"), **PTX)
    seeds = extra_world_seeds(cfg, first=cfg.train.sft.extra_worlds, count=2)
    world = generate_world(cfg.data.synthetic.model_copy(update={"seed": seeds[0]}))
    # Every other name of the first replay world (all of them would leave it no question).
    names = set(sorted({p.title for p in world.passages if p.title})[::2])
    replay = build_replay(cfg, tokenizer, names)
    assert replay is not None
    for row in replay.rows:
        answer = tokenizer.decode(row.input_ids).rsplit(ANSWER_OPEN, 1)[1]
        assert not any(f" {name} " in answer for name in names)


def test_rows_cycle_by_optimizer_step_and_split_over_ranks(policy: tuple) -> None:
    _, tokenizer = policy
    replay = build_replay(tiny_config(Path("/tmp"), **PTX), tokenizer, ())
    assert replay is not None
    first, total = step_rows(replay, 0, 0, 1)
    assert first == replay.rows[:5]
    assert total == sum(sum(r.loss_mask[1:]) for r in first)
    # Step 2 takes rows 10, 11, then wraps to 0, 1, 2.
    assert step_rows(replay, 2, 0, 1)[0] == replay.rows[10:] + replay.rows[:3]
    # Two ranks: every other row each, together the step's rows; the same total.
    mine0, total0 = step_rows(replay, 1, 0, 2)
    mine1, total1 = step_rows(replay, 1, 1, 2)
    assert mine0 == replay.rows[5:10:2] and mine1 == replay.rows[6:10:2]
    assert total0 == total1 == step_rows(replay, 1, 0, 1)[1]


def test_rank_losses_average_to_the_single_process_loss(policy: tuple) -> None:
    model, tokenizer = policy
    replay = build_replay(tiny_config(Path("/tmp"), **PTX), tokenizer, ())
    assert replay is not None
    pad = tokenizer.pad_token_id
    single = ptx_loss(model, replay, 1, 0, 1, pad)
    shares = [ptx_loss(model, replay, 1, r, 2, pad) for r in (0, 1)]
    assert torch.isclose((shares[0] + shares[1]) / 2, single, rtol=1e-5)
    # coef x the token-mean NLL of an untrained model: about coef x ln(vocab).
    assert 0.5 * 3.0 < float(single.detach()) < 0.5 * 8.0
    # More ranks than rows: the surplus ranks add nothing.
    assert float(ptx_loss(model, replay, 1, 5, 6, pad)) == 0.0
