"""Where the data-parallel work of a stage runs (`searchrl.ray_engine`): in the stage's own
process (`local`, the default) or on a Ray cluster (`ray`). Every field is operational:
results never depend on the engine or on the number of workers, so none is in a cache key."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator

from searchrl.config.base import OPERATIONAL, Section

# host:port (a GCS address, as `ray start --head` prints it) or ray://host:port (Ray Client).
_ADDRESS = re.compile(r"^(ray://)?[A-Za-z0-9._-]+:\d{1,5}$")


class EngineConfig(Section):
    SHAPES = OPERATIONAL
    kind: Literal["local", "ray"] = "local"
    # auto: the running cluster ($RAY_ADDRESS, else the one `ray start --head` started on this
    # machine); local: a private Ray instance started for the stage and stopped after it;
    # host:port or ray://host:port: that cluster.
    address: str = "auto"
    # Ray workers (actors, each loading its model once); 0: as many as the cluster's CPUs
    # (GPUs, with worker_gpus > 0) fit.
    workers: int = Field(0, ge=0)
    worker_cpus: float = Field(1.0, gt=0.0)
    worker_gpus: float = Field(0.0, ge=0.0)  # 1 on a GPU cluster: one encoder / policy a GPU
    # Seconds to reach the cluster, and for the workers to start, before the stage fails.
    connect_timeout_s: float = Field(15.0, gt=0.0)
    worker_start_timeout_s: float = Field(300.0, gt=0.0)
    # Seconds one item (an embedding shard, an evaluation chunk: model load on first use
    # included) may run on a worker before the stage fails naming it: a worker that hangs
    # while alive is never lost, so without this the stage would wait for it forever.
    item_timeout_s: float = Field(1800.0, gt=0.0)
    # Workers one item may take down (its worker process died while running it) before the
    # stage fails naming it, instead of retrying it on every worker until none is left.
    item_max_tries: int = Field(3, ge=1)
    # Processes on this machine, beside the stage's own, that run corpus validation's
    # per-chunk checks (the `corpus` GX suite and the row schema) whatever `kind` is: the
    # stage reads and writes the corpus here. 0: every check in the stage's process.
    local_workers: int = Field(1, ge=0)
    # A corpus file smaller than this is checked in the stage's process: a worker's start
    # (Python, pandas, GX: ~3 s of CPU) costs more than it saves below ~100k passages.
    local_workers_min_corpus_mb: float = Field(100.0, ge=0.0)

    @field_validator("address")
    @classmethod
    def _known_address(cls, value: str) -> str:
        if value in ("auto", "local") or _ADDRESS.match(value):
            return value
        raise ValueError(f"{value!r}: expected auto, local, host:port or ray://host:port")
