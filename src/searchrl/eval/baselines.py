"""Which systems are evaluated, and with which weights and rollout mode.

All systems run the same rollout loop on the same eval questions and retriever:

    trained        the GRPO policy, agentic loop (search as often as it likes)
    sft            the SFT starting policy, same agentic prompt: the "prompted agentic loop
                   with the untrained (not RL-trained) policy" of the same size
    no_search      the SFT policy answering directly (template opens `<answer>` at once)
    retrieve_once  the SFT policy given the top-k passages for the question, then answering
    base_agentic   the base model before any training (tiny default: a fresh random init
                   with the same tokenizer; pretrained: `model.name_or_path`), agentic loop
    champion       the policy the model registry's champion alias points at, agentic loop
    rejection_sampling  the SFT policy fine-tuned on its own correct, well-formed samples of
                   the train questions (train/rejection_sampling.py, Search-R1's RFT), agentic loop
    scripted       no policy: the fixed program of eval/scripted.py (question templates from
                   the train split, regular expressions, retriever calls; no learning)
    frontier       the frontier model behind an OpenAI-compatible endpoint (`eval.frontier`),
                   agentic loop; evaluated first, so a dead endpoint fails before hours of
                   local evaluation

The no_search / retrieve_once baselines use the SFT policy so they are the same model size
and have seen the tag format, but never learned *when* to search.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from transformers import AutoTokenizer, PreTrainedTokenizerBase

from searchrl.config import PipelineConfig
from searchrl.models.prior import is_bundled_prior
from searchrl.models.tiny import build_tiny_model

Mode = Literal["agentic", "no_search", "retrieve_once", "scripted"]
TRAINED = "trained"
SCRIPTED = "scripted"
FRONTIER = "frontier"
CHAMPION = "champion"  # the registry's champion, evaluated as a baseline
_FRONTIER_PREFIX = "frontier:"


@dataclass(frozen=True)
class SystemSpec:
    """One evaluated system: a policy source and the rollout mode it runs in.

    `policy` is a save_pretrained directory, or `random-init:<tokenizer dir>` for the tiny
    untrained base, or a model name for a pretrained base, or `frontier:<tokenizer>` for the
    endpoint in `eval.frontier` (the tokenizer is the rollout's text codec).
    """

    name: str
    policy: str
    mode: Mode
    description: str


def plan_systems(baselines: Sequence[str], *, policy_dir: str, sft_dir: str | None,
                 champion_dir: str | None, config: PipelineConfig,
                 rs_dir: str | None = None) -> tuple[list[SystemSpec], list[str]]:
    """Systems to evaluate (baselines in the given order, then `trained`) and a note for each
    requested baseline that cannot run (no SFT start, no champion registered)."""
    specs: list[SystemSpec] = []
    notes: list[str] = []
    frontier = config.eval.frontier
    if frontier is not None:
        specs.append(SystemSpec(
            FRONTIER, f"{_FRONTIER_PREFIX}{frontier.tokenizer or policy_dir}", "agentic",
            f"{frontier.model} at {frontier.base_url} (/completions), agentic loop"))
    for name in baselines:
        if name in ("sft", "no_search", "retrieve_once"):
            if sft_dir is None:
                notes.append(f"baseline {name} skipped: the training stage recorded no SFT "
                             "policy (train.sft.enabled=false)")
                continue
            # With SFT off the cold start is the base model saved unchanged: evaluated as
            # `sft` it would be reported as fine-tuned and could be chosen as the gate's
            # strongest learned comparator. base_agentic is that system, honestly named.
            if name == "sft" and not config.train.sft.enabled:
                notes.append("baseline sft skipped: train.sft.enabled=false, so the cold start "
                             "is the base model unchanged (evaluate it as base_agentic)")
                continue
            start = "SFT policy" if config.train.sft.enabled else "base model (SFT off)"
            mode: Mode = "agentic" if name == "sft" else name  # type: ignore[assignment]
            desc = {"sft": "SFT start, agentic loop (not RL-trained)",
                    "no_search": f"{start}, direct answer without retrieval",
                    "retrieve_once": f"{start}, top-k passages once, then answer"}[name]
            specs.append(SystemSpec(name, sft_dir, mode, desc))
        elif name == "rejection_sampling":
            if rs_dir is None:
                notes.append("baseline rejection_sampling skipped: the training stage recorded "
                             "no rejection-sampling policy (train.rejection_sampling.enabled="
                             "false)")
                continue
            specs.append(SystemSpec(name, rs_dir, "agentic", "SFT start fine-tuned on its own "
                                    "correct samples (rejection sampling), agentic loop"))
        elif name == "champion":
            if champion_dir is None:
                notes.append("baseline champion skipped: no policy registered under "
                             f"{config.registry_model_name}@{config.eval.champion_alias}")
                continue
            specs.append(SystemSpec(name, champion_dir, "agentic",
                                    "registry champion, agentic loop"))
        elif name == SCRIPTED:
            # Its policy is the train split it reads templates from (set by the stage).
            specs.append(SystemSpec(name, "", "scripted",
                                    "fixed program: train-split question templates, regular "
                                    "expressions, retriever calls; no learning"))
        elif name == "base_agentic":
            if is_bundled_prior(config.model.name_or_path):
                notes.append("baseline base_agentic skipped: the bundled MiniLM prior's base is "
                             "an encoder with a new, untrained LM head (models/prior.py); it "
                             "writes no answer, so it measures nothing")
                continue
            if config.model.kind == "pretrained":
                assert config.model.name_or_path is not None
                source = config.model.name_or_path
            else:
                source = f"random-init:{sft_dir or policy_dir}"
            specs.append(SystemSpec(name, source, "agentic", "untrained base model, agentic loop"))
        else:
            raise ValueError(f"eval.baselines: unknown baseline {name!r}; valid: sft, "
                             "no_search, retrieve_once, base_agentic, champion, scripted, "
                             "rejection_sampling")
    specs.append(SystemSpec(TRAINED, policy_dir, "agentic", "GRPO-trained policy, agentic loop"))
    return specs, notes


def is_endpoint(spec: SystemSpec) -> bool:
    """Whether `spec` is answered by a remote endpoint (the frontier), not a local policy."""
    return spec.policy.startswith(_FRONTIER_PREFIX)


def system_policy(spec: SystemSpec, config: PipelineConfig) -> dict[str, Any]:
    """What `make_generator` needs for one system: its saved policy directory, or (the
    random-init baseline, which has none) a freshly built model with its tokenizer, or (the
    frontier) the endpoint's settings with the tokenizer the rollout encodes its text with."""
    if is_endpoint(spec):
        if config.eval.frontier is None:
            raise ValueError(f"system {spec.name!r} needs eval.frontier (an endpoint) set")
        return {"frontier": config.eval.frontier,
                "tokenizer": AutoTokenizer.from_pretrained(
                    spec.policy.removeprefix(_FRONTIER_PREFIX))}
    if spec.policy.startswith("random-init:"):
        tok_dir = Path(spec.policy.removeprefix("random-init:"))
        tokenizer: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(str(tok_dir))
        return {"model": build_tiny_model(config.model.tiny, tokenizer, seed=config.run.seed),
                "tokenizer": tokenizer}
    return {"policy_dir": spec.policy}
