#!/usr/bin/env bash
# The GPU check for a short loan (under 9 minutes on one H100 or H200): SimA's op sweep at the acceptance grid (bf16,
# H 6, d 64, B 128 and 8, N 197 577 1025 4097 16385, forward and forward+backward, against SDPA flash, with the share
# of HBM bandwidth reached; ELU and XNorm beside them), SimA's backend table for this GPU, the CUDA tests beside the
# torch.compile(fullgraph=True) DeiT-S train-step check, and DeiT-S training throughput and peak memory, SimA
# against softmax, at 224 and 512 px. Installs nothing: it runs on the machine's python3 (torch, Triton, timm) with
# the repo's src on PYTHONPATH.
#
# Usage, from the repo root:  OUT=folder scripts/gpu_check.sh   (default folder runs/gpu_check)
# Writes 8 files to the folder (what a device loan brings back): summary.txt (GPU, versions, one line per stage
# with its exit code and seconds), logs.txt (compile-ahead, tests, compile check), attention.txt (both sweeps' logs
# and tables), attention_b128.json, attention_b8.json, sima_gpu_table.json (copy it to src/simattn/attention/ to
# let backend 'auto' use it), compile_check.json and model.tgz (the model table: json, csv, md, png). Each stage has
# its own time limit, so one that hangs cannot eat the loan.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-runs/gpu_check}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
rm -rf "$OUT"/{summary.txt,logs.txt,attention.txt,sima_gpu_table.json,model,model.tgz}

stage() {  # stage NAME SECONDS LOGFILE COMMAND...
    local name=$1 limit=$2 log=$3 start rc
    shift 3
    start=$(date +%s)
    echo "== $name" >> "$log"
    timeout "$limit" "$@" >> "$log" 2>&1
    rc=$?
    echo "$name: exit $rc in $(( $(date +%s) - start )) s (log $(basename "$log"))" | tee -a "$OUT/summary.txt"
}

{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  "$PY" -c "import torch, triton, timm; print('torch', torch.__version__, 'triton', triton.__version__, 'timm', \
timm.__version__, torch.cuda.get_device_name())"; nproc; } > "$OUT/summary.txt" 2>&1
cat "$OUT/summary.txt"

# Triton compiles each autotuned configuration serially in the process that first calls it: compile the sweep's
# kernels first, in parallel processes, into Triton's on-disk cache
stage "compile ahead" 80 "$OUT/logs.txt" "$PY" scripts/triton_compile_ahead.py --batch 128 8 \
    --tokens 197 577 1025 4097 16385 --jobs 10
grep -h "compiled\|failed" "$OUT/logs.txt" | tail -12

for B in 128 8; do  # autotuned, as users run it
    repeats=$(( B == 128 ? 10 : 20 ))  # B 128 at N 16385: flash fwd+bwd takes over a second per call
    limit=$(( B == 128 ? 90 : 80 ))
    stage "attention B=$B" "$limit" "$OUT/attention.txt" "$PY" -m simattn bench attention --device cuda \
        --heads 6 --head-dim 64 --batch "$B" --tokens 197 577 1025 4097 16385 --dtype bfloat16 \
        --kinds sima sima_triton sdpa_flash elu xnorm --repeats "$repeats" --rounds 1 \
        --output "$OUT/attention_b$B.json" --write-table "$OUT/sima_gpu_table.json"
done
grep -v "^  " "$OUT/attention.txt"

# the tests check results, not speed: one launch configuration per kernel (each shape compiles once), spread over
# processes so compiles run in parallel; -o addopts: the suite's own options need plugins the GPU machine may lack.
# The compile check runs beside them (neither is timed).
stage "compile fullgraph DeiT-S" 140 "$OUT/compile_check.log" "$PY" scripts/gpu_compile_check.py \
    "$OUT/compile_check.json" &
# (one inductor compile thread: its pool of compile processes outlives the test, which the suite counts as a leak)
stage tests 140 "$OUT/tests.log" env SIMATTN_TRITON_AUTOTUNE=0 TORCHINDUCTOR_COMPILE_THREADS=1 "$PY" -m pytest -q -o addopts="-ra" \
    -p no:randomly -p no:cacheprovider -n 6 --dist load tests/test_sima_cuda.py tests/test_sima_triton.py -k cuda
wait
cat "$OUT/tests.log" "$OUT/compile_check.log" >> "$OUT/logs.txt" && rm -f "$OUT/tests.log" "$OUT/compile_check.log"
grep -E "passed|failed|error" "$OUT/logs.txt" | tail -15

# SimA as 'auto' picks it from the package's table (sima) and on the Triton kernels (triton), against softmax
stage "model DeiT-S train" 140 "$OUT/logs.txt" "$PY" -m simattn bench model --device cuda \
    --models sima_deit_small_patch16_224 --attn sima triton=sima softmax --attn-kwargs triton.backend=triton \
    --img-size 224 512 --precision bf16 \
    --measure train-throughput memory --fill-batch --batch-size 256 --warmup 2 --repeats 5 --rounds 1 \
    --output "$OUT/model"
tar czf "$OUT/model.tgz" -C "$OUT" model 2>/dev/null && rm -rf "$OUT/model"
grep -A 12 "== model" "$OUT/logs.txt" | tail -12
cat "$OUT/summary.txt"
