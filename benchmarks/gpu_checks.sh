#!/usr/bin/env bash
# The checks issue 10 asks for whenever a GPU machine is lent, one part per command so that
# each fits a 10-minute call. Logs go to $OUT (the device tool's folder) or ./gpu-checks.
#
#   bash benchmarks/gpu_checks.sh tests       # the whole test suite, CUDA and vision tests included
#   bash benchmarks/gpu_checks.sh throughput  # BN-Inception and timm ResNet-50, fp32 and bf16,
#                                             # a profile of each, and exact evaluation at SOP
#                                             # size on the GPU
#   bash benchmarks/gpu_checks.sh torchrun    # distributed_scaling.py, one process per GPU
#   bash benchmarks/gpu_checks.sh neurve      # issue 12: the authors' MSimCLR and SimCLR next
#                                             # to kdml's on mnist5k (ResNet-18, d = 2); needs
#                                             # neurve's source in .neurve (carry it)
#   QUICK=1 bash benchmarks/gpu_checks.sh throughput   # tiny sizes, any device: a smoke test
#                                             # (timm's part skipped where timm is missing)
#
# benchmarks/gpu_session.sh runs all four in one call, each under a deadline (a session's device
# time allows about one call).
#
# The GPU image lacks faiss, PML, kornia, mlxtend and mnist1d: fetch their wheels here with
# ../shared/tools/gpu-wheels.sh and install them there first (that script prints how).
# Record what it prints, with the GPU model from the log's first lines, in docs/benchmarks.md.
set -euo pipefail
cd "$(dirname "$0")/.."
part=${1:?"name a part: tests, throughput, torchrun or neurve"}
logs=${OUT:-gpu-checks}
# each part's own copies of what it prints (machine, tests, throughput, torchrun and neurve
# logs); gpu_session.sh, which keeps each part's whole output in $OUT/PART.out, sends them
# elsewhere, since the device tool returns at most 8 files from $OUT. The neurve part's JSON
# results always go to $logs.
copies=${COPIES:-$logs}
mkdir -p "$logs" "$copies"
export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
python=${PYTHON:-python3}
quick=()
if [[ -n "${QUICK:-}" ]]; then quick=(--quick); fi

{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null \
    || echo "nvidia-smi: none"
  "$python" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda,
"available", torch.cuda.is_available())'
} | tee "$copies/$part-machine.txt"

case "$part" in
  tests)
    # The suite as `make test` runs it, minus ruff and mypy (lint and types do not depend on
    # the machine); over several processes where pytest-xdist is installed and PYTEST_ADDOPTS
    # asks for them (gpu_session.sh does), else in one.
    "$python" -m pytest -q -rs -p no:cacheprovider --durations=10 2>&1 | tee "$copies/tests.txt"
    ;;
  throughput)
    # Exact evaluation does not depend on the backbone: it runs once. The profile says where
    # each step's device time goes, and how many host-device synchronisations it makes.
    for backbone in bninception timm:resnet50; do
      # the quick smoke test on a machine without timm (this CPU one) says so and goes on;
      # the real check fails instead, so that a record never lacks ResNet-50 unsaid
      if [[ $backbone == timm:* && -n "${QUICK:-}" ]] \
          && ! "$python" -c 'import timm' 2>/dev/null; then
        echo "skipped $backbone: timm is not importable here" \
          "(pip install -c constraints.txt -e '.[vision]')" \
          | tee "$copies/throughput-${backbone/:/-}.txt"
        continue
      fi
      sections=(train profile)
      if [[ $backbone == bninception ]]; then sections=(train eval profile); fi
      "$python" benchmarks/train_throughput.py --backbone "$backbone" --channels-last \
        --precisions bf16 fp32 --sections "${sections[@]}" "${quick[@]}" 2>&1 \
        | tee "$copies/throughput-${backbone/:/-}.txt"
    done
    ;;
  torchrun)
    # One process per GPU under torchrun (NCCL): the step and the share of the batch gathers.
    # NCCL takes one GPU per process, and torchrun with one process is a plain run (kdml joins
    # no group), so a 1-GPU machine measures no scaling: it trains one short run instead.
    # the GPUs torch sees (nvidia-smi -L ignores CUDA_VISIBLE_DEVICES: more ranks than GPUs)
    gpus=$("$python" -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)
    if (( gpus >= 2 )); then
      "$python" -m torch.distributed.run --standalone --nproc_per_node="$gpus" \
        benchmarks/distributed_scaling.py --device cuda --batch $((100 * gpus)) 2>&1 \
        | tee "$copies/torchrun.txt"
    else
      echo "$gpus GPU(s): NCCL scaling needs 2 or more; one torchrun process trains instead" \
        | tee "$copies/torchrun.txt"
      run_dir=$(mktemp -d)/run
      "$python" -m torch.distributed.run --standalone --nproc_per_node=1 -m kdml train jrd \
        --dataset mnist5k --no-progress --out "$run_dir" train.epochs=1 2>&1 \
        | tee -a "$copies/torchrun.txt"
    fi
    ;;
  neurve)
    # Get the source where there is internet (git clone https://github.com/ekorman/neurve
    # .neurve), or from a mirror: git --git-dir=MIRROR archive 1ea5661 | tar -x -C .neurve.
    # EPOCHS=100 is the paper's; SEEDS="0 1 2" its three runs, if the time allows.
    for charts in 16 0; do
      "$python" benchmarks/neurve_side_by_side.py --neurve "${NEURVE:-.neurve}" \
        --dataset "${DATASET:-mnist5k}" --dim 2 --charts "$charts" --epochs "${EPOCHS:-100}" \
        --seeds ${SEEDS:-0} --out "$logs/neurve-charts$charts.json" 2>&1 \
        | tee -a "$copies/neurve.txt"
    done
    ;;
  *)
    echo "unknown part '$part': name tests, throughput, torchrun or neurve" >&2
    exit 2
    ;;
esac
