#!/bin/bash
# The 7B-class scored-format benchmark (bench_7b.py) and the fixture retrain, step by step, for a GPU host without
# network access that receives the staged files in parts and keeps its scratch space ($ARBITER_GPU_WORK) between the
# steps of one run (benchmarks/gpu/README.md). Run from the repo root; DEV and WHL name the folders the vLLM staging
# and stage-wheels.sh filled (default .dev and .whl).
#   step     staged files it reads   what it does
#   stage1   DEV/c0 DEV/da           stash part 1; start training the fixture model (compact + lines + JSON answers)
#   stage2   DEV/c1 DEV/db           stash part 2
#   stage3   DEV/c2 DEV/dc           stash part 3
#   start    DEV/c3 WHL              unpack vLLM; wait for the fixture; build the 7B model; start vLLM through the
#                                    runtime's entrypoint + the lines decision server (they stay up)
#   bench                            the benchmark (bench-7b.json)
#   fixture                          the trained fixture model served instead: agreement through both formats
# With network access and vLLM 0.26.0 installed: `bash benchmarks/gpu/device_7b.sh local` does it all.
set -u
step=${1:?usage: device_7b.sh stage1|stage2|stage3|start|bench|fixture|local}
DEV=${DEV:-.dev}; WHL=${WHL:-.whl}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 VLLM_USE_FLASHINFER_SAMPLER=0
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
WORK=${ARBITER_GPU_WORK:-${TMPDIR:-/tmp}}  # scratch space: the models, the unpacked vLLM, the logs
RESULTS=${ARBITER_GPU_RESULTS:-$WORK/arbiter-gpu-out}; mkdir -p "$RESULTS"
FIXTURE=$WORK/model; BIG=$WORK/m7b; SITE=$WORK/site
py=python3
[ -d $SITE/vllm ] && export PYTHONPATH=$SITE:$PWD/operator:$PWD/runtime

train() { $py benchmarks/gpu/build_model.py --out $FIXTURE --train-seconds "${TRAIN_SECONDS:-100}"; }

wait_fixture() {
  for _ in $(seq 1 300); do
    [ -f $FIXTURE/arbiter-fixture.json ] && break
    pgrep -f build_model.py >/dev/null || break
    sleep 1
  done
  [ -f $FIXTURE/arbiter-fixture.json ] || { echo "no trained fixture; training now"; train > $WORK/train.log 2>&1; }
  cp $WORK/train.log "$RESULTS/train.log"; cp $FIXTURE/arbiter-fixture.json "$RESULTS/fixture.json"
}

unpack() {
  cp $DEV/c3 $WORK/stash/ && cat $WORK/stash/c? > $WORK/v.tar.xz && mkdir -p $SITE &&
    $py -c "import tarfile; tarfile.open('$WORK/v.tar.xz').extractall('$SITE')" &&
    $py -m pip install -q --no-index --no-deps --no-compile --target $SITE $WORK/stash/*.whl $WHL/*.whl || exit 1
  export PYTHONPATH=$SITE:$PWD/operator:$PWD/runtime
}

case $step in
  stage1)
    mkdir -p $WORK/stash && cp $DEV/c0 $DEV/da/*.whl $WORK/stash/
    nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv
    $py -c 'import torch, transformers, tokenizers; print("torch", torch.__version__, "transformers", transformers.__version__, "tokenizers", tokenizers.__version__)'
    setsid nohup $py benchmarks/gpu/build_model.py --out $FIXTURE --train-seconds "${TRAIN_SECONDS:-100}" \
      > $WORK/train.log 2>&1 < /dev/null &
    sleep "${STAGE1_WAIT:-15}"; tail -3 $WORK/train.log ;;
  stage2) cp $DEV/c1 $DEV/db/*.whl $WORK/stash/ && tail -2 $WORK/train.log ;;
  stage3)  # also a one-layer smoke build of the 7B model with the fixture's tokenizer (saved before training)
    cp $DEV/c2 $DEV/dc/*.whl $WORK/stash/ && tail -2 $WORK/train.log
    $py benchmarks/gpu/bench_7b.py build --tokenizer-dir $FIXTURE --out $WORK/smoke --layers 1 2>&1 | tail -3
    rm -rf $WORK/smoke ;;
  start)
    t0=$(date +%s); [ -d $SITE/vllm ] || unpack; echo "vLLM unpacked in $(( $(date +%s) - t0 ))s"
    wait_fixture; tail -4 $WORK/train.log
    $py benchmarks/gpu/bench_7b.py build --tokenizer-dir $FIXTURE --out $BIG 2>&1 | tail -3 | tee "$RESULTS/build-7b.log"
    mkdir -p /mnt && ln -sfn $BIG /mnt/models
    $py benchmarks/gpu/bench_7b.py start --wait "${START_WAIT:-400}" 2>&1 | tee "$RESULTS/start.log"
    grep -iE "vllm.*version|backend|Available KV|graph" $WORK/arbiter-gpu/supervisor.log | head -12 ;;
  bench)
    $py benchmarks/gpu/bench_7b.py bench --out "$RESULTS" 2>&1 | tee "$RESULTS/bench.log" | grep -v '^{' ;;
  fixture)
    $py benchmarks/gpu/bench_7b.py stop
    ln -sfn $FIXTURE /mnt/models
    $py benchmarks/gpu/bench_7b.py start --wait 300 && $py benchmarks/gpu/bench_7b.py agree --n "${N:-1000}" --out "$RESULTS"
    $py benchmarks/gpu/bench_7b.py stop
    tail -c 400000 $WORK/arbiter-gpu/supervisor.log > "$RESULTS/supervisor.log" ;;
  local)
    train > $WORK/train.log 2>&1 || exit 1
    export PYTHONPATH=$PWD/operator:$PWD/runtime
    mkdir -p $WORK/stash; cp $FIXTURE/arbiter-fixture.json "$RESULTS/fixture.json"
    $py benchmarks/gpu/bench_7b.py build --tokenizer-dir $FIXTURE --out $BIG && ln -sfn $BIG /mnt/models &&
      $py benchmarks/gpu/bench_7b.py start && $py benchmarks/gpu/bench_7b.py bench --out "$RESULTS"
    bash "$0" fixture ;;
  *) echo "unknown step $step"; exit 2 ;;
esac
