#!/usr/bin/env bash
# Installs Reflex and its default models on a fresh machine, then runs the main job.
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
"$PY" -m pip install -q --disable-pip-version-check -e '.[dev,rag,adapter]'
# CUDA kernels, ahead of time (SASS sm_75..sm_90 + PTX): only where nvcc exists; a kernel that stops
# compiling fails here
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then "$PY" kernels/build.py --require; fi
"$PY" -m reflex fetch            # default models, sha256-verified, into $REFLEX_MODELS or ~/.cache/reflex/models
"$PY" -m reflex smoke            # main job: a real generation on the default model, with timings
