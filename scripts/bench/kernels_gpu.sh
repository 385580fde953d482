#!/usr/bin/env bash
# Record #89's kernels on one GPU (H100 or H200), in one command of at most 9 minutes, the most
# telling first:
#
#   bash scripts/bench/kernels_gpu.sh [OUT]      # OUT: results/kernels; BUDGET=530 (seconds)
#
# 1. Record #89's stage 1 as one GPU of 8 with the three kernel keys (varlen attention where
#    this torch's varlen_attn takes a window, the Triton loss, the fused FP8 MLP): ms/step
#    beside the record's 31.50 ms per GPU, and the compile's seconds from cold caches.
# 2. Each kernel beside the path it replaces, measured in the same run, with the ratio and
#    whether the two agree (scripts/bench/attention.py at stages 1 and 3, loss_kernel.py,
#    mlp_kernel.py).
# 3. Stage 1 again in a new process: the compile's seconds from the caches the first left.
#
# A step that passes its time is stopped and the next runs; each step's output goes to
# OUT/<step>.log and the lines to read to OUT/SUMMARY.md. Without network: carry the wheels of
# hydra-core, omegaconf and antlr4 (docs/gpu-proof.md); the steps need no corpus.
set -u
OUT=${1:-results/kernels}
BUDGET=${BUDGET:-530}
PY=${PYTHON:-python}
cd "$(dirname "$0")/../.."
mkdir -p "$OUT"
SUMMARY="$OUT/SUMMARY.md"
: >"$SUMMARY"

KEYS=(--set model.head.loss_kernel=triton --set model.mlp.fp8_kernel=triton)
why=$($PY -c 'import torch; from model.varlen import varlen_support
cuda = torch.cuda.is_available()
print((varlen_support(torch.device("cuda")) or "") if cuda else "no CUDA device")' 2>&1 | tail -1)
if [ -z "$why" ]; then
  KEYS+=(--set model.attention.impl=varlen)
else
  echo "varlen attention left out: $why" | tee -a "$SUMMARY"
fi

# step NAME SECONDS COMMAND...: runs COMMAND under min(SECONDS, the budget left)
step() {
  local name=$1 cap=$2
  shift 2
  local left=$((BUDGET - SECONDS))
  if [ "$left" -lt 20 ]; then
    echo "## $name: not run, the budget was spent" >>"$SUMMARY"
    return
  fi
  [ "$cap" -gt "$left" ] && cap=$left
  local t0=$SECONDS
  timeout --kill-after=5 "$cap" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  {
    echo "## $name: exit $rc in $((SECONDS - t0)) s (cap $cap s)"
    echo '```'
    tail -n 14 "$OUT/$name.log"
    echo '```'
  } >>"$SUMMARY"
}

PROOF=(-m scripts.bench.gpu_proof env record_2026_07_17 --stages 1 --no-eval "${KEYS[@]}")
step cold 300 $PY "${PROOF[@]}" --cap record_2026_07_17=290 --out "$OUT/cold"
step attention_stage1 70 $PY scripts/bench/attention.py
step attention_stage3 70 $PY scripts/bench/attention.py --tokens 49152 --window 1408 \
  --piece 2048 --paired
step loss_kernel 50 $PY scripts/bench/loss_kernel.py
step mlp_kernel 70 $PY scripts/bench/mlp_kernel.py
step warm 200 $PY "${PROOF[@]}" --cap record_2026_07_17=190 --out "$OUT/warm"
cat "$SUMMARY"
