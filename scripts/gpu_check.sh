#!/usr/bin/env bash
# The GPU check for a short loan (under 8 minutes on one H100 or H200): the CUDA tests, SimA's op sweep at the
# acceptance grid (bf16, H 6, d 64, B 128 and 8, N 197 577 1025 4097 16385, forward and forward+backward, against
# SDPA flash, with the share of HBM bandwidth reached; ELU and XNorm beside them), SimA's backend table for this GPU,
# and the torch.compile(fullgraph=True) DeiT-S train-step check. Installs nothing: it runs on the machine's python3
# (torch, Triton, timm) with the repo's src on PYTHONPATH.
#
# Usage, from the repo root:  OUT=folder scripts/gpu_check.sh   (default folder runs/gpu_check)
# Writes 8 files to the folder (what a device loan brings back): summary.txt (GPU, versions, one line per stage
# with its exit code), tests.txt, attention.txt (both sweeps' logs), attention_b128.json, attention_b8.json,
# sima_gpu_table.json (copy it to src/simattn/attention/ to let backend 'auto' use it), compile_check.json and
# compile_check.txt. Each stage has its own time limit (470 s in all), so one that hangs cannot eat the loan.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-runs/gpu_check}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
rm -f "$OUT"/{summary.txt,tests.txt,attention.txt,compile_check.txt,sima_gpu_table.json}

stage() {  # stage NAME SECONDS LOGFILE COMMAND...
    local name=$1 limit=$2 log=$3 start rc
    shift 3
    start=$(date +%s)
    timeout "$limit" "$@" >> "$log" 2>&1
    rc=$?
    echo "$name: exit $rc in $(( $(date +%s) - start )) s (log $(basename "$log"))" | tee -a "$OUT/summary.txt"
}

{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  "$PY" -c "import torch, triton, timm; print('torch', torch.__version__, 'triton', triton.__version__, 'timm', \
timm.__version__, torch.cuda.get_device_name())"; } > "$OUT/summary.txt" 2>&1
cat "$OUT/summary.txt"

# the tests check results, not speed: one launch configuration per kernel (each shape compiles once); the bench
# stages below run the benchmark's CUDA code, so its tests (tests/test_bench_cuda.py) are left to a longer loan
# -o addopts: the suite's own (pytest-xdist workers, the timeout plugin) need plugins the GPU machine may lack
stage tests 170 "$OUT/tests.txt" env SIMATTN_TRITON_AUTOTUNE=0 "$PY" -m pytest -q -o addopts="-ra" -p no:randomly \
    -p no:cacheprovider \
    tests/test_sima_cuda.py tests/test_sima_triton.py -k cuda
tail -3 "$OUT/tests.txt"

for B in 128 8; do  # autotuned, as users run it
    stage "attention B=$B" 100 "$OUT/attention.txt" "$PY" -m simattn bench attention --device cuda \
        --heads 6 --head-dim 64 --batch "$B" --tokens 197 577 1025 4097 16385 --dtype bfloat16 \
        --kinds sima sima_triton sdpa_flash elu xnorm --repeats 20 --rounds 1 --output "$OUT/attention_b$B.json" \
        --write-table "$OUT/sima_gpu_table.json"
done
grep -v "^  " "$OUT/attention.txt" | head -80

stage "compile fullgraph DeiT-S" 100 "$OUT/compile_check.txt" "$PY" scripts/gpu_compile_check.py \
    "$OUT/compile_check.json"
tail -1 "$OUT/compile_check.txt"
cat "$OUT/summary.txt"
