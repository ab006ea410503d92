# GPU image for scheduled retraining (the `gpu` extra: vLLM + faiss-gpu) on a CUDA worker.
# Built by the `searchrl-weekly-gpu` deployment's build step (prefect.yaml); not built in CI
# (no Docker engine there), kept correct by review and `hadolint`-style checks in tests.
FROM nvidia/cuda:12.4.1-cudnn-runtime-ubuntu22.04

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PREFECT_SERVER_ANALYTICS_ENABLED=false \
    TOKENIZERS_PARALLELISM=false

RUN apt-get update \
    && apt-get install -y --no-install-recommends python3.11 python3.11-venv python3.11-dev \
       build-essential git ca-certificates \
    && rm -rf /var/lib/apt/lists/*

RUN useradd --create-home --uid 1000 searchrl
WORKDIR /opt/searchrl
RUN python3.11 -m venv /opt/venv && chown -R searchrl:searchrl /opt/venv /opt/searchrl
ENV PATH=/opt/venv/bin:$PATH

# Dependencies first so code edits do not reinstall them.
COPY --chown=searchrl:searchrl pyproject.toml README.md ./
COPY --chown=searchrl:searchrl src/searchrl/__init__.py src/searchrl/__init__.py
USER searchrl
RUN pip install --upgrade pip \
    && pip install "torch==2.5.1" --index-url https://download.pytorch.org/whl/cu124 \
    && pip install -e ".[gpu]"

COPY --chown=searchrl:searchrl . .
RUN pip install --no-deps -e .

# Secrets (MLFLOW_TRACKING_TOKEN, PREFECT_API_KEY, SEARCHRL_RETRIEVER_TOKEN) come from the
# environment at run time, never baked into the image.
ENTRYPOINT ["python", "flows/pipeline.py"]
CMD ["--config", "configs/qwen2.5-3b-8gpu.yaml"]
