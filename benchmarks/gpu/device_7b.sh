#!/bin/bash
# The 7B-class benchmark (bench_7b.py: bf16 against FP8, vLLM alone against through the runtime), the FP8 agreement
# on the trained fixture (fp8_agree.py) and throughput over GPUs (scale_gpus.py), step by step, for a GPU host
# without network access that receives the staged files in parts and keeps its scratch space ($ARBITER_GPU_WORK)
# between the steps of one run (benchmarks/gpu/README.md). Run from the repo root; DEV and WHL name the folders the
# vLLM staging and stage-wheels.sh filled (default .dev and .whl).
#   step     staged files it reads   what it does
#   stage1   DEV/c0 DEV/da           stash part 1; start training the fixture model (compact + lines + JSON answers)
#   stage2   DEV/c1 DEV/db           stash part 2
#   stage3   DEV/c2 DEV/dc           stash part 3; a one-layer smoke build of the 7B model
#   start    DEV/c3 WHL              unpack vLLM; the fixture served bf16 and FP8 side by side: agreement (the 7B
#                                    model builds meanwhile); then the 7B model's bf16 arm starts (it stays up)
#   bench1                           bf16 measured; restart as fp8; fp8 measured
#   bench2                           restart as fp8-kv; measured; restart as the better FP8 arm with n-gram
#                                    speculative decoding; measured; stop; the table of every arm and the agreement
#   scale    DEV/c3 WHL              (after stage1-3, on a host of several GPUs) unpack; build the 7B model; one
#                                    replica per GPU; 1, 2, 4, 8 replicas measured (scale_gpus.py)
#   frontend DEV/c3 WHL              (after stage1-3) unpack; build the 7B model (no training); fp8 measured, then
#                                    fp8 with four API server processes (fp8-api4) measured (FRONTEND_ARMS); table.
#                                    Run again with other FRONTEND_ARMS (e.g. bf16 fp8-fused fp8-fused-api4): the
#                                    unpacked vLLM and the model are kept, and the table grows
#   tp2                              replicas 0 and 1 give way to one replica of tensor parallel 2; measured; table
# With network access and vLLM 0.26.0 installed: `bash benchmarks/gpu/device_7b.sh local` does it all.
#   standin                        without a GPU: start, bench1 and bench2 against the vLLM stand-in (no vLLM, no
#                                  model, no training: the scripts' plumbing only; docs/gpu.md)
#   standin-scale                  without a GPU: scale and tp2 with GPUS (default 2) stand-in replicas
set -u
step=${1:?usage: device_7b.sh stage1|stage2|stage3|start|bench1|bench2|scale|tp2|local|standin|standin-scale}
DEV=${DEV:-.dev}; WHL=${WHL:-.whl}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 VLLM_USE_FLASHINFER_SAMPLER=0
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
WORK=${ARBITER_GPU_WORK:-${TMPDIR:-/tmp}}  # scratch space: the models, the unpacked vLLM, the logs
RESULTS=${ARBITER_GPU_RESULTS:-$WORK/arbiter-gpu-out}; mkdir -p "$RESULTS"
FIXTURE=$WORK/model; BIG=$WORK/m7b; SITE=$WORK/site
export ARBITER_GPU_STATE=${ARBITER_GPU_STATE:-$WORK/arbiter-gpu}
export ARBITER_GPU_MODEL_DIR=${ARBITER_GPU_MODEL_DIR:-/mnt/models}  # where the rendered arguments serve from
py=${PY:-python3}
B7="$py benchmarks/gpu/bench_7b.py"; AG="$py benchmarks/gpu/fp8_agree.py"
[ -d $SITE/vllm ] && export PYTHONPATH=$SITE:$PWD/operator:$PWD/runtime
stamp() { echo "=== $(date -u +%H:%M:%S) $*"; }

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

serve_7b() {  # the 7B model where the rendered arguments serve from (and beside it, with the fused format's tokenizer)
  if [ "$ARBITER_GPU_MODEL_DIR" = /mnt/models ]; then
    mkdir -p /mnt && ln -sfn $BIG /mnt/models && ln -sfn $BIG-fused /mnt/models-fused
  fi
}

agreement() {  # the fixture, bf16 and FP8 side by side; the 7B model builds meanwhile unless it exists
  stamp "fixture bf16 and fp8 up"
  $AG up --fixture-dir $FIXTURE --wait "${FIXTURE_WAIT:-150}" > "$RESULTS/agree-up.log" 2>&1; up=$?
  cat "$RESULTS/agree-up.log"
  [ -d $BIG ] || [ "${ARBITER_GPU_STANDIN:-}" = 1 ] || { $B7 build --tokenizer-dir $FIXTURE --out $BIG ${LAYERS:+--layers $LAYERS} > $WORK/build-7b.log 2>&1 & }
  if [ $up = 0 ]; then
    stamp "agreement"; $AG agree --n "${N:-1000}" --out "$RESULTS" 2>&1 | tee "$RESULTS/agree.log"
  fi
  wait; [ -f $WORK/build-7b.log ] && tail -3 $WORK/build-7b.log | tee "$RESULTS/build-7b.log"
}

measure() {  # the running arm
  stamp "bench $($py -c "import pathlib,os; print(pathlib.Path(os.environ['ARBITER_GPU_STATE'], 'arm').read_text())")"
  $B7 bench --out "$RESULTS" 2>&1 | tee -a "$RESULTS/bench.log" | grep -v '^{'
}

switch() {
  stamp "switch to $1"
  $B7 switch --arm "$1" --out "$RESULTS" --wait "${START_WAIT:-200}" 2>&1 | tee -a "$RESULTS/start.log" | tail -40
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
    $B7 build --tokenizer-dir $FIXTURE --out $WORK/smoke --layers 1 2>&1 | tail -3
    rm -rf $WORK/smoke $WORK/smoke-fused ;;
  start)
    t0=$(date +%s); [ -d $SITE/vllm ] || $py -c "import vllm" 2>/dev/null || unpack; stamp "vLLM unpacked in $(( $(date +%s) - t0 ))s"
    wait_fixture; tail -4 $WORK/train.log
    agreement
    serve_7b; stamp "7B bf16 up"
    $B7 start --arm bf16 --wait "${START_WAIT:-200}" 2>&1 | tee "$RESULTS/start.log"
    grep -iE "vllm.*version|backend|Available KV|graph|quantiz|label tokens resolved" $ARBITER_GPU_STATE/supervisor.log | head -12 ;;
  bench1)
    measure; switch fp8; measure
    $B7 report --out "$RESULTS" > /dev/null ;;
  bench2)
    switch fp8-kv; measure; switch ngram; measure
    stamp "stop"; $B7 stop
    [ -f "$RESULTS/agree-fp8.json" ] || agreement  # the first try failed: once more, with the GPU free
    tail -c 400000 $ARBITER_GPU_STATE/supervisor.log > "$RESULTS/supervisor.log"
    stamp "report"; $B7 report --out "$RESULTS" ;;
  local)  # any machine with vLLM 0.26.0 installed (or ARBITER_GPU_STANDIN=1): every step in one go
    [ -f $FIXTURE/arbiter-fixture.json ] || train > $WORK/train.log 2>&1 || { tail -40 $WORK/train.log; exit 1; }
    export PYTHONPATH=$PWD/operator:$PWD/runtime:$PWD/devenv
    mkdir -p $WORK/stash; wait_fixture
    agreement; serve_7b
    $B7 start --arm bf16 --wait "${START_WAIT:-200}" 2>&1 | tee "$RESULTS/start.log" || exit 1
    bash "$0" bench1 && bash "$0" bench2 ;;
  scale)
    t0=$(date +%s); [ -d $SITE/vllm ] || $py -c "import vllm" 2>/dev/null || unpack; stamp "vLLM unpacked in $(( $(date +%s) - t0 ))s"
    [ -d $BIG ] || $B7 build --tokenizer-dir $FIXTURE --out $BIG 2>&1 | tail -3 | tee "$RESULTS/build-7b.log"
    serve_7b; stamp "replicas up"
    $py benchmarks/gpu/scale_gpus.py replicas --gpus "${GPUS:-$(nvidia-smi -L | wc -l)}" --arm "${SCALE_ARM:-fp8}" \
      --out "$RESULTS" 2>&1 | tee "$RESULTS/scale.log" | grep -v '^{' ;;
  frontend)
    t0=$(date +%s); [ -d $SITE/vllm ] || unpack; stamp "vLLM unpacked in $(( $(date +%s) - t0 ))s"
    pkill -f build_model.py; sleep 2  # the tokenizer is saved; the GPU is the benchmark's alone
    [ -d $BIG ] || $B7 build --tokenizer-dir $FIXTURE --out $BIG 2>&1 | tail -1 | tee "$RESULTS/build-7b.log"
    serve_7b; set -- ${FRONTEND_ARMS:-fp8 fp8-api4}  # the arms measured, the first started, the others switched to
    $B7 start --arm "$1" --wait "${START_WAIT:-200}" 2>&1 | tail -3; measure
    for arm in "${@:2}"; do switch "$arm"; measure; done
    stamp "stop"; $B7 stop; $B7 report --out "$RESULTS" ;;
  tp2)
    stamp "tp2"; $py benchmarks/gpu/scale_gpus.py tp2 --arm "${SCALE_ARM:-fp8}" --out "$RESULTS" 2>&1 |
      tee -a "$RESULTS/scale.log" | grep -v '^{'
    $py benchmarks/gpu/scale_gpus.py report --out "$RESULTS" ;;
  standin-scale)
    export ARBITER_GPU_STANDIN=1 PYTHONPATH=$PWD/operator:$PWD/runtime:$PWD/devenv
    [ "$ARBITER_GPU_MODEL_DIR" = /mnt/models ] && export ARBITER_GPU_MODEL_DIR=$WORK/standin-7b
    mkdir -p "$ARBITER_GPU_MODEL_DIR"
    $py benchmarks/gpu/scale_gpus.py replicas --gpus "${GPUS:-2}" --arm "${SCALE_ARM:-fp8}" --out "$RESULTS" \
      --wait 120 2>&1 | tee "$RESULTS/scale.log" | grep -v '^{' || exit 1
    bash "$0" tp2 ;;
  standin)  # the plumbing: the stand-in plays vLLM (it writes its tokenizer into the model directories)
    export ARBITER_GPU_STANDIN=1 PYTHONPATH=$PWD/operator:$PWD/runtime:$PWD/devenv
    [ "$ARBITER_GPU_MODEL_DIR" = /mnt/models ] && export ARBITER_GPU_MODEL_DIR=$WORK/standin-7b
    mkdir -p $FIXTURE "$ARBITER_GPU_MODEL_DIR"
    agreement
    $B7 start --arm bf16 --wait "${START_WAIT:-120}" 2>&1 | tee "$RESULTS/start.log" || exit 1
    bash "$0" bench1 && bash "$0" bench2 ;;
  *) echo "unknown step $step"; exit 2 ;;
esac
