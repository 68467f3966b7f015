#!/usr/bin/env bash
# Create .venv in the repo root if it is missing and install simattn into it, with the tested torch/torchvision
# versions from constraints.txt (pyproject.toml itself only states version ranges).
# Usage: scripts/setup_venv.sh [extras]   e.g. scripts/setup_venv.sh test
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
spec="."
[ -n "$extras" ] && spec=".[${extras}]"
# Quiet unless it fails; the editable install is fast when everything is already there.
.venv/bin/python -m pip install -q -c constraints.txt -e "$spec"
# pip byte-compiles what it installs, but the editable install leaves simattn's own modules as sources: compiled
# here once, they are not recompiled by every process where bytecode is not written (PYTHONDONTWRITEBYTECODE).
.venv/bin/python -m compileall -q src > /dev/null
# SimA's compiled CPU kernel, once per machine and torch version (seconds when it is built already). Without a C++
# compiler it says so and SimA runs in torch: set-up does not fail for it.
.venv/bin/simattn build-kernels || true
