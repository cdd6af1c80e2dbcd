#!/usr/bin/env bash
# One-time, idempotent set-up of a fresh machine: a virtualenv in .venv with kd and its test tools.
# torch is installed first as the CPU wheel 2.13.0 when no torch is present: a plain `torch`
# requirement would pull a multi-GB CUDA build (on GPU machines, install your CUDA torch first).
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
if ! python -c "import torch" 2>/dev/null; then
  pip install -q --disable-pip-version-check "torch==2.13.0"
fi
if ! python -c "import kd.cli, pytest, sentence_transformers" 2>/dev/null || [ pyproject.toml -nt .venv/.kd-installed ]; then
  pip install -q --disable-pip-version-check -e ".[test]"
  touch .venv/.kd-installed
fi
