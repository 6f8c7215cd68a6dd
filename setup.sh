#!/usr/bin/env bash
# Installs Reflex and its default models on a fresh machine, then runs the main job.
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
"$PY" -m pip install -q --disable-pip-version-check -e '.[dev,rag,adapter]'
# CUDA kernels, ahead of time (SASS sm_75..sm_90 + PTX): only where nvcc exists; a kernel that stops
# compiling fails here
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then "$PY" kernels/build.py --require; fi
# real documents for reflex-rag's tests and recall benchmark (Python's HTML docs); optional: the
# tests that need them skip when /usr/share/doc/python3/html is absent
if [ ! -d /usr/share/doc/python3/html ] && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-doc >/dev/null 2>&1 \
    || { apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-doc >/dev/null 2>&1; } \
    || echo "setup: python3-doc not installed (rag corpus tests will skip)" >&2
fi
"$PY" -m reflex fetch            # default models, sha256-verified, into $REFLEX_MODELS or ~/.cache/reflex/models
"$PY" -m reflex smoke            # main job: a real generation on the default model, with timings
