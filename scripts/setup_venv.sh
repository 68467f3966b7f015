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
.venv/bin/python -m pip install -q --no-compile -c constraints.txt -e "$spec"
# Bytecode in one compileall on every core rather than pip's file-by-file pass (about 20 s less on 2 cores), simattn's
# own sources included: the editable install leaves them uncompiled, and every process would recompile them where
# bytecode is not written (PYTHONDONTWRITEBYTECODE). Left out, as nothing here imports them: packages' own tests and
# examples, pip, and ExecuTorch's backends other than XNNPACK (a third of the files). As with pip, files that are not
# Python 3 (templates, test data of some packages) are left uncompiled.
site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
unused='/(tests?|examples)/|/site-packages/pip/|/executorch/backends/(?!xnnpack/|transforms/)[^/]+/'
.venv/bin/python -m compileall -qq -j 0 -x "$unused" "$site" src || true
# SimA's compiled CPU kernel, once per machine and torch version (seconds when it is built already). Without a C++
# compiler it says so and SimA runs in torch: set-up does not fail for it.
.venv/bin/simattn build-kernels || true
