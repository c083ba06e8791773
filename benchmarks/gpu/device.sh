#!/bin/bash
# The GPU run, step by step, for a GPU host without network access that receives the staged files in parts and keeps
# its scratch space ($ARBITER_GPU_WORK) between the steps of one run (benchmarks/gpu/README.md). From the repo root,
# after vLLM 0.26.0 was staged into .dev/ and `benchmarks/gpu/stage-wheels.sh` filled .whl/:
#   step    staged files it reads    what it does
#   stage1  .dev/c0 .dev/da          stash part 1; start training the model fixture in the background
#   stage2  .dev/c1 .dev/db          stash part 2
#   stage3  .dev/c2 .dev/dc          stash part 3
#   phase1  .dev/c3 .whl             unpack vLLM, install wheels, wait for the model; TP1 checks + benchmark
#   phase2  (none)                   fallback/hand-back (vLLM killed, back as TP2); TP2 checks + benchmark
#   gen     .dev/c3 .whl             (after stage1-3) generated-mode checks + benchmark only, TP1
#   diag    .dev/c3 .whl .dev/model  (after stage1-3 without training) generated_diag.py on a model built earlier
# On any GPU machine with network access and vLLM 0.26.0 installed, `bash benchmarks/gpu/device.sh local` does it
# all in one go (build, phase1, phase2).
set -u
step=${1:?usage: device.sh stage1|stage2|stage3|phase1|phase2|gen|diag|local}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 VLLM_USE_FLASHINFER_SAMPLER=0
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
WORK=${ARBITER_GPU_WORK:-${TMPDIR:-/tmp}}  # scratch space: the model, the unpacked vLLM, the logs
RESULTS=${ARBITER_GPU_RESULTS:-$WORK/arbiter-gpu-out}; mkdir -p "$RESULTS"
MODEL=$WORK/model
SITE=$WORK/site
py=python3

train() {  # the model fixture: ~100 s of training on GPU 0
  CUDA_VISIBLE_DEVICES=0 $py benchmarks/gpu/build_model.py --out $MODEL --train-seconds "${TRAIN_SECONDS:-100}"
}

use_site() { export PYTHONPATH=$SITE:$PWD/operator:$PWD/runtime; }

finish_model() {  # wait for the background training of stage1, or train now if it never ran or failed
  for _ in $(seq 1 240); do
    [ -f $MODEL/arbiter-fixture.json ] && break
    pgrep -f build_model.py >/dev/null || break
    sleep 1
  done
  if [ ! -f $MODEL/arbiter-fixture.json ]; then
    echo "no trained model yet (train log below); training now"; tail -5 $WORK/train.log 2>/dev/null
    train > $WORK/train.log 2>&1 || { tail -40 $WORK/train.log; exit 1; }
  fi
  cp $WORK/train.log "$RESULTS/train.log"; cp $MODEL/arbiter-fixture.json "$RESULTS/fixture.json"
  tar czf "$RESULTS/model.tar.gz" -C $MODEL .
  mkdir -p /mnt && ln -sfn $MODEL /mnt/models   # the path the operator's rendered args serve from
}

case $step in
  stage1)
    mkdir -p $WORK/stash && cp .dev/c0 .dev/da/*.whl $WORK/stash/
    nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv
    $py -c 'import torch, transformers, tokenizers; print("torch", torch.__version__, "gpus", torch.cuda.device_count(), "transformers", transformers.__version__, "tokenizers", tokenizers.__version__)'
    # Its own session, so the training outlives this command and runs while stage2 and stage3 transfer.
    setsid nohup env CUDA_VISIBLE_DEVICES=0 $py benchmarks/gpu/build_model.py --out $MODEL \
      --train-seconds "${TRAIN_SECONDS:-100}" > $WORK/train.log 2>&1 < /dev/null &
    sleep "${STAGE1_WAIT:-45}"; tail -5 $WORK/train.log ;;
  stage2) cp .dev/c1 .dev/db/*.whl $WORK/stash/ && tail -3 $WORK/train.log ;;
  stage3) cp .dev/c2 .dev/dc/*.whl $WORK/stash/ && tail -3 $WORK/train.log ;;
  phase1)
    t0=$(date +%s)
    cp .dev/c3 $WORK/stash/ && cat $WORK/stash/c? > $WORK/v.tar.xz && mkdir -p $SITE &&
      $py -c "import tarfile; tarfile.open('$WORK/v.tar.xz').extractall('$SITE')" &&
      $py -m pip install -q --no-index --no-deps --no-compile --target $SITE $WORK/stash/*.whl .whl/*.whl || exit 1
    echo "vLLM unpacked and wheels installed in $(( $(date +%s) - t0 ))s"
    finish_model
    use_site
    $py benchmarks/gpu/device_run.py phase1 --out "$RESULTS" 2>&1 | tee "$RESULTS/phase1.log" ;;
  phase2)
    use_site
    $py benchmarks/gpu/device_run.py phase2 --out "$RESULTS" 2>&1 | tee "$RESULTS/phase2.log"
    tar czf "$RESULTS/logs.tar.gz" -C $WORK/arbiter-gpu . 2>/dev/null ;;
  diag)  # generated-mode diagnosis on a fresh host: reads .dev/c3 .whl .dev/model (model.tar.gz of phase1)
    t0=$(date +%s)
    cp .dev/c3 $WORK/stash/ && cat $WORK/stash/c? > $WORK/v.tar.xz && mkdir -p $SITE &&
      $py -c "import tarfile; tarfile.open('$WORK/v.tar.xz').extractall('$SITE')" &&
      $py -m pip install -q --no-index --no-deps --no-compile --target $SITE $WORK/stash/*.whl .whl/*.whl || exit 1
    mkdir -p $MODEL /mnt && tar xzf .dev/model/model.tar.gz -C $MODEL && ln -sfn $MODEL /mnt/models
    use_site
    $py - <<'PY' 2>&1 | tee "$RESULTS/diag.log"
import asyncio, sys
sys.path.insert(0, "benchmarks/gpu")
import stack
stack.start_vllm(1); stack.start_runtime("generated")
asyncio.run(stack.wait_ready(stack.VLLM_URL + "/health", 400, "vllm"))
PY
    $py benchmarks/gpu/generated_diag.py --out "$RESULTS" --bench 2>&1 | tee -a "$RESULTS/diag.log" ;;
  gen)  # generated mode again after the key-order fix: a model trained in stage1, vLLM TP1, generated checks + bench
    cp .dev/c3 $WORK/stash/ && cat $WORK/stash/c? > $WORK/v.tar.xz && mkdir -p $SITE &&
      $py -c "import tarfile; tarfile.open('$WORK/v.tar.xz').extractall('$SITE')" &&
      $py -m pip install -q --no-index --no-deps --no-compile --target $SITE $WORK/stash/*.whl .whl/*.whl || exit 1
    finish_model
    use_site
    $py - <<'PY' 2>&1 | tee "$RESULTS/gen.log"
import asyncio, sys
sys.path.insert(0, "benchmarks/gpu")
import stack
stack.start_vllm(1); stack.start_runtime("generated")
asyncio.run(stack.wait_ready(stack.VLLM_URL + "/health", 400, "vllm"))
PY
    GPU_BENCH_QUICK=1 $py benchmarks/gpu/generated_diag.py --out "$RESULTS" --bench standard 2>&1 | tee -a "$RESULTS/gen.log" ;;
  local)
    [ -f $MODEL/arbiter-fixture.json ] || train > $WORK/train.log 2>&1 || { tail -40 $WORK/train.log; exit 1; }
    finish_model
    export PYTHONPATH=$PWD/operator:$PWD/runtime
    $py benchmarks/gpu/device_run.py all --out "$RESULTS" 2>&1 | tee "$RESULTS/run.log" ;;
  *) echo "unknown step $step"; exit 2 ;;
esac
