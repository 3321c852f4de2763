#!/usr/bin/env bash
# The benchmarks that need a GPU, in one go and within one time budget: a short smoke run of the
# influence engine, the ResNet-18 influence comparison with kronfluence 1.0.1 at N = 1,000 training
# images and 100 queries (with the projected hours for 50,000 images x 21 checkpoints), the
# curvature engine against the reference loop, feature extraction, and the tiny BERT against
# kronfluence. Each step has its own time limit, so one that fails or runs long leaves the others'
# results; the JSON reports and one log land in OUT.
#
#   PYTHON=python3 bash benchmarks/gpu.sh OUT [KRONFLUENCE_PYTHON]
#
# PYTHON must hold torch with CUDA and epochlens's dependencies (the source is put on the path);
# KRONFLUENCE_PYTHON (default: PYTHON) must import kronfluence 1.0.1. Without a GPU every step runs
# on the CPU and takes hours: use benchmarks/influence.py's own smaller sizes there.
set -u
out=${1:?usage: bash benchmarks/gpu.sh OUT [KRONFLUENCE_PYTHON]}
py=${PYTHON:-python3}
kf=${2:-$py}
mkdir -p "$out"
log=$out/gpu.log
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1

step() { # step NAME SECONDS COMMAND...: run with a time limit, output to the log, say how it ended
    local name=$1 limit=$2 start rc
    shift 2
    start=$(date +%s)
    echo "== $name (limit ${limit} s): $*" >>"$log"
    timeout "$limit" "$@" >>"$log" 2>&1
    rc=$?
    echo "== $name: exit $rc after $(($(date +%s) - start)) s" | tee -a "$log"
}

report() { # report NAME SECONDS BENCHMARK ARGS...: a step whose JSON report (--json) is OUT/NAME.json
    local name=$1 limit=$2
    shift 2
    step "$name" "$limit" sh -c 'json=$1; shift; "$@" --json >"$json"' sh "$out/$name.json" "$py" "$@"
}

{
    date -u
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv
    "$py" -c "import torch, sys; print(sys.version.split()[0], torch.__version__, torch.cuda.is_available())"
} >>"$log" 2>&1

report influence_smoke 60 benchmarks/influence.py --model small_cnn --n-train 256 --n-query 16 \
    --device cuda
step influence_resnet18 300 "$py" benchmarks/influence.py --model resnet18_lop --n-train 1000 \
    --n-query 100 --fisher empirical --device cuda --kronfluence "$kf" --repeats 1 \
    --out "$out/influence_resnet18_n1000.json"
report curvature_resnet18 60 benchmarks/curvature.py --model resnet18_lop --device cuda \
    --n-samples 4096 --batch-size 256 --repeats 2
report features_resnet18 45 benchmarks/features.py --model resnet18_lop --device cuda \
    --n-samples 2000 --repeats 1
step influence_bert 60 "$py" benchmarks/influence.py --model tiny_bert --n-train 1000 --n-query 100 \
    --fisher empirical --device cuda --kronfluence "$kf" --repeats 2 \
    --out "$out/influence_bert_n1000.json"
date -u >>"$log"
