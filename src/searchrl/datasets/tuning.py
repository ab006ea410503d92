"""Tuning worlds and the sealed world (issue 33): hyperparameters are chosen on the dev
splits of `data.synthetic.tuning_seeds`; the headline world (the config's own seed, when it is
not among them) is read by no tuning run. Tuning benchmarks take `--world-seed` (default: the
first tuning seed) and refuse any other world."""

from __future__ import annotations

from searchrl.config import ConfigError, PipelineConfig


def default_tuning_seed(config: PipelineConfig) -> int:
    seeds = config.data.synthetic.tuning_seeds
    if not seeds:
        raise ConfigError("data.synthetic.tuning_seeds is empty: name the worlds tuning may "
                          "read (configs/tiny.yaml lists them)")
    return seeds[0]


def require_tuning_world(config: PipelineConfig) -> None:
    """ConfigError unless the configured synthetic world is one of the tuning worlds."""
    world = config.data.synthetic
    if world.seed not in world.tuning_seeds:
        raise ConfigError(
            f"data.synthetic.seed={world.seed} is not a tuning world "
            f"(data.synthetic.tuning_seeds={list(world.tuning_seeds)}): tuning benchmarks run "
            "on tuning worlds only, so the sealed world's figures stay unread by tuning; pass "
            "--world-seed with one of them")
