# GPU image for scheduled retraining on a CUDA worker: the base dependencies and the `gpu` extra
# (vLLM + faiss-gpu, never faiss-cpu) from their lock, docker/requirements-gpu.txt, which pins
# the torch vLLM asks for (scripts/lock_gpu.sh). Built by the `searchrl-weekly-gpu` deployment's
# build step (prefect.yaml). No Docker engine runs in CI: tests/unit/test_deploy_files.py checks
# this file, .dockerignore, the entrypoint and the worker's rendered container settings.
#
# Base by digest: the linux/amd64 manifest of nvidia/cuda:12.8.1-cudnn-runtime-ubuntu22.04 as
# pinned in public Dockerfiles (not pulled here: no engine). CUDA 12.8 is the lock's torch's.
# To move it: `docker buildx imagetools inspect nvidia/cuda:<tag>` and re-lock to match.
ARG BASE_IMAGE=nvidia/cuda:12.8.1-cudnn-runtime-ubuntu22.04@sha256:59e0e4376a0f16d10b03d3a14344b80a866a1674cb4948cb318291387ac05010
FROM ${BASE_IMAGE}

# SEARCHRL_DATA_DIR: the persistent volume (work dir, results, tracking store, stewards'
# overrides, model cache), mounted by the deployment; see prefect.yaml.
ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PREFECT_SERVER_ANALYTICS_ENABLED=false \
    TOKENIZERS_PARALLELISM=false \
    SEARCHRL_DATA_DIR=/data/searchrl

RUN apt-get update \
    && apt-get install -y --no-install-recommends python3.11 python3.11-venv python3.11-dev \
       build-essential git ca-certificates \
    && rm -rf /var/lib/apt/lists/*

# The data dir is created owned by the runtime user so a new named volume mounted on it takes
# that owner (a bind-mounted host directory must be owned by uid 1000).
RUN useradd --create-home --uid 1000 searchrl \
    && mkdir -p /data/searchrl && chown searchrl:searchrl /data/searchrl
WORKDIR /opt/searchrl
RUN python3.11 -m venv /opt/venv && chown -R searchrl:searchrl /opt/venv /opt/searchrl
ENV PATH=/opt/venv/bin:$PATH
USER searchrl

# Dependencies first, exactly the lock (hashes checked, nothing resolved here), so code edits
# do not reinstall them.
COPY --chown=searchrl:searchrl docker/requirements-gpu.txt docker/requirements-gpu.txt
RUN pip install --require-hashes --no-deps -r docker/requirements-gpu.txt

# What .dockerignore leaves: code, configs, contracts, bundled tiny data; no runs, tracking
# stores, virtualenvs or .env files.
COPY --chown=searchrl:searchrl . .
RUN pip install --no-deps --no-build-isolation -e .

# Secrets (MLFLOW_TRACKING_TOKEN, PREFECT_API_KEY, SEARCHRL_RETRIEVER_TOKEN) come from the
# environment at run time, never baked into the image.
# The entrypoint runs what a Prefect worker asks (`prefect flow-run execute`) as given, and the
# pipeline for no arguments (the real config) or pipeline arguments (`--config ...`, `key=value`).
ENTRYPOINT ["/opt/searchrl/docker/entrypoint.sh"]
