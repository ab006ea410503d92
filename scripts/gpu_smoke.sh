#!/usr/bin/env bash
# GPU smoke test: the real path (CLI stages -> DeepSpeed launcher -> ranks) on one CUDA GPU,
# at most ~8 minutes on one H100, with nothing downloaded:
#   - a randomly initialised small Qwen2-architecture model built from config
#     (model.tiny.architecture=qwen2) with the project's own corpus-trained tokenizer;
#   - validate -> index -> curriculum (cold start + difficulty on the GPU through the
#     generator factory) -> train (train.launch.mode=deepspeed: DeepSpeed's launcher, ZeRO-2,
#     bf16 from configs/deepspeed/zero2.json, HF rollouts on the GPU) -> checkpoint, then a
#     second train call that must resume -> evaluate;
#   - vLLM is skipped (its wheels pin their own CUDA torch and cannot be carried).
# Prints PASS / FAIL / SKIP per part and exits non-zero if any part failed.
#
# The lent GPU machine has torch and transformers but no deepspeed, faiss or the rest of the
# stack, and no network. Carry wheels (under 64 MiB per call) built here with
#   .venv/bin/pip download --no-deps -d wheels/ deepspeed bm25s great-expectations ...
# and pass them with WHEELS=wheels/ (the device tool's `carry`); a part whose packages are
# missing is reported as SKIP with the import that failed, never as PASS.
#
#   scripts/gpu_smoke.sh [OUT_DIR]          (OUT_DIR default: $OUT or /tmp/searchrl-gpu-smoke)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-${OUT:-/tmp/searchrl-gpu-smoke}}"
PY="${PYTHON:-python}"
mkdir -p "$OUT"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export PYTHONPATH="$PWD/src:${PYTHONPATH:-}"
unset DS_ACCELERATOR
declare -A RESULT
ORDER=()
report() { RESULT[$1]="$2"; ORDER+=("$1"); echo "== $1: $2"; }

if [ -n "${WHEELS:-}" ] && [ -d "$WHEELS" ]; then
  "$PY" -m pip install -q --no-index --find-links "$WHEELS" "$WHEELS"/*.whl \
    || echo "some carried wheels did not install"
fi

if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  report cuda "FAIL (torch sees no CUDA device)"; exit 1
fi
"$PY" -c "import torch; print('device:', torch.cuda.get_device_name(0), 'torch', torch.__version__)"
report cuda PASS

missing=$("$PY" - <<'EOF'
import importlib
need = ["pydantic", "yaml", "tokenizers", "deepspeed", "bm25s", "great_expectations", "tqdm",
        "matplotlib", "pandas", "pyarrow"]
print(" ".join(m for m in need if importlib.util.find_spec(m) is None))
EOF
)
if [ -n "$missing" ]; then
  for part in stages train resume evaluate; do
    report "$part" "SKIP (not installed here: $missing; carry their wheels, see the header)"
  done
  report vllm "SKIP (vLLM cannot be carried to this machine)"
  exit 0
fi

SMOKE=(
  "run.device=cuda" "run.work_dir=$OUT/work" "tracking.tracking_uri=sqlite:///$OUT/mlflow.db"
  "model.dtype=bfloat16" "model.tiny.architecture=qwen2" "model.tiny.n_layer=4"
  "model.tiny.n_embd=256" "model.tiny.n_head=4"
  "data.synthetic.n_people=80" "data.synthetic.n_organisations=20"
  "data.synthetic.n_train=120" "data.synthetic.n_dev=20" "data.synthetic.n_test=40"
  "train.sft.extra_worlds=1" "train.sft.extra_world_demos=300" "train.sft.epochs=1"
  "curriculum.max_questions=32" "curriculum.samples_per_question=4"
  "train.launch.mode=deepspeed" "train.launch.ranks=1" "train.zero_stage=2"
  "train.deepspeed_config=configs/deepspeed/zero2.json" "train.questions_per_step=4"
  "train.checkpoint_every=2" "train.eval_every=0" "rollout.backend=hf"
  "eval.max_questions=40" "eval.baselines=[no_search,sft]"
)
stage() { timeout "$1" "$PY" -m searchrl "$2" --config configs/tiny.yaml "${SMOKE[@]}" "${@:3}"; }

if stage 240 validate >"$OUT/validate.log" 2>&1 && stage 120 index >"$OUT/index.log" 2>&1 \
   && stage 240 curriculum >"$OUT/curriculum.log" 2>&1 \
   && grep -q '"sft_device": "cuda' "$OUT/work/train_policy/sft/searchrl_sft_stats.json"; then
  report stages "PASS (the cold start's SFT ran on cuda)"
else
  report stages "FAIL (see $OUT/{validate,index,curriculum}.log)"
fi

if stage 240 train train.steps=2 >"$OUT/train.log" 2>&1 \
   && [ -d "$OUT/work/train_policy/checkpoints/step_000002" ]; then
  report train "PASS (ZeRO-2 bf16 through the launcher; checkpoint step 2)"
else
  report train "FAIL (see $OUT/train.log)"
fi

if stage 240 train train.steps=4 >"$OUT/resume.log" 2>&1 \
   && grep -q "resumed from" "$OUT/resume.log"; then
  report resume "PASS (resumed at step 2, finished step 4)"
else
  report resume "FAIL (see $OUT/resume.log)"
fi

if stage 180 evaluate train.steps=4 >"$OUT/evaluate.log" 2>&1 \
   && [ -f "$OUT/work/evaluate_policy/results.json" ]; then
  report evaluate PASS
else
  report evaluate "FAIL (see $OUT/evaluate.log)"
fi

report vllm "SKIP (vLLM cannot be carried to this machine: its wheels pin a CUDA torch)"

echo; echo "GPU smoke summary:"
status=0
for part in "${ORDER[@]}"; do
  echo "  $part: ${RESULT[$part]}"
  case "${RESULT[$part]}" in FAIL*) status=1 ;; esac
done
exit $status
