#!/usr/bin/env bash
# The GPU check for a short loan (under 9 minutes on one H100 or H200): SimA's op sweep at the acceptance grid (bf16,
# H 6, d 64, B 128 and 8, N 197 577 1025 4097 16385, forward and forward+backward, against SDPA flash, with the share
# of HBM bandwidth reached, eager and from CUDA graphs), SimA's backend table for this GPU, the CUDA tests beside the
# torch.compile(fullgraph=True) DeiT-S train-step check, and the model rows (bf16 autocast, AdamW, training images/s):
# DeiT-S eager at 224 px batch 256, 512 px batch 64 and 1024 px batch 16 (SimA 'auto', SimA on Triton, softmax and
# the attention-free floor), compiled at 224 px (default mode and reduce-overhead, SimA and softmax), and a Semantic
# FPN at 1024x2048 batch 8 (SimA and its floor), with scripts/gpu_model_check.py's verdicts on them. It runs on the
# machine's python3 (torch, Triton, timm) with the repo's src on PYTHONPATH, and installs only the wheels
# scripts/gpu_wheels.sh put in .whl (segmentation_models_pytorch, for the FPN rows; carry .whl with the run).
#
# Usage, from the repo root:  OUT=folder scripts/gpu_check.sh   (default folder runs/gpu_check)
# Writes 9 files to the folder (what a device loan brings back): summary.txt (GPU, versions, one line per stage
# with its exit code and seconds, and the verdicts), logs.txt (compile-ahead, tests, compile check), attention.txt
# (the sweeps' logs and tables), attention_b128.json, attention_b8.json, attention_peers_b128.json (the newer kinds
# against flash, with scripts/gpu_peers_check.py's verdicts in summary.txt), sima_gpu_table.json (copy it to
# src/simattn/attention/ to let backend 'auto' use it), compile_check.json and model.tgz (the model rows: one bench
# model folder per stage, and the verdicts, model_check.txt, also in summary.txt). Each stage has its own time
# limit, so one that hangs cannot eat the loan.
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

# the op acceptance, autotuned as users run it: SimA eager (Triton, and torch for the backend table) against flash,
# each time eager and replayed from a CUDA graph (the host's cost is the difference: B 8, N 197), % HBM at B 128;
# a measurement takes about a second, and 3 calls at least (flash fwd+bwd at B 128, N 16385: ~0.7 s a call)
for B in 128 8; do
    limit=$(( B == 128 ? 75 : 60 ))
    stage "attention B=$B" "$limit" "$OUT/attention.txt" "$PY" -m simattn bench attention --device cuda \
        --heads 6 --head-dim 64 --batch "$B" --tokens 197 577 1025 4097 16385 --dtype bfloat16 \
        --kinds sima sima_triton sdpa_flash --repeats 20 --rounds 1 \
        --output "$OUT/attention_b$B.json" --write-table "$OUT/sima_gpu_table.json"
done
# the newer kinds against flash where their acceptance is set (B 128, N >= 577 for the linear ones, every N for
# sigmoid attention; scripts/gpu_peers_check.py's verdicts); their kernels compile inside the stage (the warm-up
# calls), hence its longer limit
stage "attention peers B=128" 90 "$OUT/attention.txt" "$PY" -m simattn bench attention --device cuda \
    --heads 6 --head-dim 64 --batch 128 --tokens 197 577 1025 4097 --dtype bfloat16 \
    --kinds sdpa_flash slab_triton flatten_triton inline_triton polaformer_triton sigmoid_triton relu_triton agent \
    agent_triton \
    --repeats 10 --rounds 1 --output "$OUT/attention_peers_b128.json"
grep -v "^  " "$OUT/attention.txt"
"$PY" scripts/gpu_peers_check.py "$OUT/attention_peers_b128.json" 2>&1 | tee -a "$OUT/summary.txt"

# the tests check results, not speed: one launch configuration per kernel (each shape compiles once), spread over
# processes so compiles run in parallel; -o addopts: the suite's own options need plugins the GPU machine may lack.
# The compile check runs beside them (neither is timed).
stage "compile fullgraph DeiT-S" 140 "$OUT/compile_check.log" "$PY" scripts/gpu_compile_check.py \
    "$OUT/compile_check.json" &
# segmentation_models_pytorch (the FPN rows' decoder) is not in the device image: the carried wheels, no index
if ! "$PY" -c "import segmentation_models_pytorch" 2>/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/simattn_wheels \
        .whl/*.whl \
        && export PYTHONPATH="$PYTHONPATH:/tmp/simattn_wheels" \
        || echo "segmentation_models_pytorch: not installed and no wheel in .whl (scripts/gpu_wheels.sh, then carry" \
                ".whl): the FPN rows will fail" | tee -a "$OUT/summary.txt"
fi
mkdir -p "$OUT/model"
# a row that hangs is abandoned after --timeout s, so the stage still writes the others
DEIT=(-m simattn bench model --device cuda --models sima_deit_small_patch16_224 --precision bf16
      --measure train-throughput --warmup 3 --repeats 10 --rounds 1 --timeout 60)
# the compiled rows' graphs into inductor's on-disk caches beside the untimed tests (one short run of each, thrown
# away), so that the timed rows below trace and load them instead of compiling for a minute each
for mode in default reduce-overhead; do
    stage "compile ahead DeiT-S $mode" 140 "$OUT/model/warm_$mode.log" "$PY" "${DEIT[@]}" --attn sima softmax \
        --img-size 224 --batch-size 256 --compile --compile-mode "$mode" --warmup 1 --repeats 1 --timeout 130 \
        --output "/tmp/simattn_warm_$mode" &
done
# (one inductor compile thread: its pool of compile processes outlives the test, which the suite counts as a leak)
# The newer kinds' kernel tests run on the GPU whole (their device fixture gives CUDA tensors where compiled).
stage tests 160 "$OUT/tests.log" env SIMATTN_TRITON_AUTOTUNE=0 TORCHINDUCTOR_COMPILE_THREADS=1 \
    "$PY" -m pytest -q -o addopts="-ra" -p no:randomly -p no:cacheprovider -n 8 --dist load \
    tests/test_sima_cuda.py tests/test_sima_triton.py tests/test_activation_triton.py tests/test_agent_triton.py \
    tests/test_linear_kinds_triton.py \
    -k "cuda or activation_triton or agent_triton or linear_kinds_triton"
wait
cat "$OUT/tests.log" "$OUT/compile_check.log" >> "$OUT/logs.txt" && rm -f "$OUT/tests.log" "$OUT/compile_check.log"
grep -E "passed|failed|error" "$OUT/logs.txt" | tail -15

# SimA as 'auto' picks it (sima) and on the Triton kernels (triton), against softmax and the attention-free floor
stage "model DeiT-S eager" 200 "$OUT/model/eager.log" "$PY" "${DEIT[@]}" --attn sima triton=sima softmax \
    --attn-kwargs triton.backend=triton --img-size 224 512 1024 --batch-size 256 64 16 --floor \
    --output "$OUT/model/model_eager"
stage "model DeiT-S compiled" 90 "$OUT/model/compiled.log" "$PY" "${DEIT[@]}" --attn sima softmax \
    --img-size 224 --batch-size 256 --compile --output "$OUT/model/model_compiled"
stage "model DeiT-S reduce-overhead" 90 "$OUT/model/graphs.log" "$PY" "${DEIT[@]}" --attn sima softmax \
    --img-size 224 --batch-size 256 --compile --compile-mode reduce-overhead --output "$OUT/model/model_graphs"
# 150 classes at 1024x2048 and batch 8 are 2.5e9 logits: the loss runs in chunks
stage "model FPN 1024x2048" 100 "$OUT/model/fpn.log" "$PY" "${DEIT[@]}" --head fpn \
    --img-size 1024x2048 --batch-size 8 --attn sima --floor --warmup 2 --repeats 5 --output "$OUT/model/model_fpn"
"$PY" scripts/gpu_model_check.py "$OUT/model" > "$OUT/model/model_check.txt" 2>&1
grep -h "^|" "$OUT"/model/model_*/bench_model.md | grep -v "^|---" | cut -c1-200
cat "$OUT/model/model_check.txt" | tee -a "$OUT/summary.txt"
tar czf "$OUT/model.tgz" -C "$OUT" model 2>/dev/null && rm -rf "$OUT/model"
cat "$OUT/summary.txt"
