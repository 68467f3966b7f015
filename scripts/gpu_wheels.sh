#!/usr/bin/env bash
# Wheels of what the GPU check needs and the device image lacks, into .whl/ (ignored by git), for
# scripts/gpu_check.py (run 2) to install there with no package index (the device reaches none):
# segmentation_models_pytorch, the FPN rows' decoder, at the version this checkout's venv runs. It is pure Python
# (one wheel for any machine), and what it requires (huggingface-hub, numpy, pillow, safetensors, timm, torch,
# torchvision, tqdm) is in the image.
# Run it here before a loan, and carry .whl with the run.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
version=$("$PY" -c "from importlib.metadata import version; print(version('segmentation_models_pytorch'))")
mkdir -p .whl
rm -f .whl/segmentation_models_pytorch-*.whl  # one version of each: two stop the whole install
"$PY" -m pip download -q --no-deps --only-binary=:all: --implementation py --python-version 3.12 --platform any \
    -d .whl "segmentation_models_pytorch==$version"
ls -l .whl
