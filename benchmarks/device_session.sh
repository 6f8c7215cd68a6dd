#!/usr/bin/env bash
# A whole device session in three calls of < 10 minutes each, issued back to back so the machine
# stays warm (build/llama.cpp, the fatbin and /tmp/models survive between them):
#   A  llama.cpp build (background, sm_90) | fatbin for every target, GPU model tests (TESTS= to pick
#      others), the synthetic benchmark models (SmolLM2-, Qwen3-0.6B-, MiniLM-shaped)
#   B  reflex bench SmolLM2- and Qwen3-shaped files vs llama-simple/llama-bench (cache warm + dropped)
#   C  GPU cold embed + chunk throughput vs llama-embedding; `reflex-rag ask` cold on the GPU over
#      the eval pages, repeat penalty on the device and on the host
# Usage (device, repo root): bash benchmarks/device_session.sh A|B|C    results in $OUT (or /tmp/out)
#   AB: A without tests then B, in one call (PYC and EMBED apply; A_BUDGET=420 s caps the build)
#   PYC=1: precompiled bytecode for numpy/reflex/rag in /tmp/pyc (see below)
#   PV=1: `reflex bench --probe-variants` (no early weights copy, eager module loading, context
#      after the imports, ...: probes and the cold command without the copy, same call)
# Carry (git-ignored, made here; see the README of benchmarks/device_run.sh for the vocab files):
#   A: .whl .devdata/smollm2-vocab.gguf .devdata/minilm-vocab.gguf .devdata/llama.cpp.tgz
#      (llama-cpp-python 0.3.36's vendor/llama.cpp without models/ docs/ media/ tests/ benches/)
#   B, C: (the machine from A, still warm) C also: .whl .devdata/smollm2-vocab.gguf .devdata/minilm-vocab.gguf .devdata/faiss312.tar.xz
#      (faiss-cpu's abi3 wheel unpacked) .devdata/pydoc-subset.tar.xz (the pages that
#      scripts/rag_eval_questions.json includes, from Debian's python3-doc)
set -u
STAGE=${1:?usage: device_session.sh A|B|C|AB}
if [ "$STAGE" = AB ]; then  # one call from a cold machine: A (llama.cpp build cut at A_BUDGET s) then B
  A_BUDGET=${A_BUDGET:-420} TESTS=${TESTS:-none} bash "$0" A
  [ "${PYC:-}" = 1 ] && export PYTHONPYCACHEPREFIX=/tmp/pyc; PYC= bash "$0" B; exit; fi
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 REFLEX_VOCAB_GGUF=$PWD/.devdata/smollm2-vocab.gguf REFLEX_PARITY_REPORT=$OUT/parity.jsonl
mkdir -p /tmp/site
python3 -c "import gguf" 2>/dev/null || python3 -m pip install -q --no-index --no-deps --no-compile \
  --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
[ -f .devdata/faiss312.tar.xz ] && [ ! -d /tmp/site/faiss ] && tar xJf .devdata/faiss312.tar.xz -C /tmp/site
export PYTHONPATH=/tmp/site:$PWD
LLAMA=$PWD/build/llama.cpp/build/bin
# Bytecode: where the interpreter may not write __pycache__ (PYTHONDONTWRITEBYTECODE, read-only
# site-packages) every process compiles numpy from source: 47 -> 220 ms for `import numpy` on the
# dev machine. PYC=1 compiles numpy and reflex once into a cache prefix, as docker/Dockerfile's
# images ship them, and records what the machine had before
if [ "${PYC:-}" = 1 ]; then
  python3 - > "$OUT/pyc.txt" 2>&1 <<'PY'
import os, sys, importlib.util, pathlib
np_dir = pathlib.Path(importlib.util.find_spec("numpy").origin).parent
print("dont_write_bytecode", sys.flags.dont_write_bytecode, "PYTHONDONTWRITEBYTECODE",
      os.environ.get("PYTHONDONTWRITEBYTECODE"), "numpy dir", np_dir, "writable", os.access(np_dir, os.W_OK))
import json; print("stdlib json bytecode", json.__cached__, os.path.exists(json.__cached__ or ""))
print("numpy .pyc files present:", len(list(np_dir.rglob("*.pyc"))), "of", len(list(np_dir.rglob("*.py"))), ".py")
PY
  for i in 1 2; do python3 -X importtime -c "import numpy" 2>&1 | tail -1 >> "$OUT/pyc.txt"; done
  # with a cache prefix the interpreter reads bytecode only from under it, the stdlib's own
  # __pycache__ included, so the stdlib is compiled into the prefix too (else datetime, inspect,
  # typing... would compile from source in every process: ~60 ms on the dev machine)
  export PYTHONPYCACHEPREFIX=/tmp/pyc
  python3 -m compileall -q -j 0 -x '/(test|tests|idlelib|tkinter|turtledemo|lib2to3)/' $(python3 -c '
import importlib.util, os, sysconfig
print(sysconfig.get_path("stdlib"))
for m in ("numpy", "regex", "cupy", "cupy_backends", "fastrlock"):
    s = importlib.util.find_spec(m)
    if s and s.origin: print(os.path.dirname(s.origin))') reflex rag \
    >> "$OUT/pyc.txt" 2>&1
  for i in 1 2; do python3 -X importtime -c "import numpy" 2>&1 | tail -1 >> "$OUT/pyc.txt"; done
  for i in 1 2; do python3 -X importtime -c "import reflex.engine, reflex.backends.cuda_backend" 2>&1 \
    | grep -E '\| (numpy|reflex.engine|reflex.backends.cuda_backend|site)$' >> "$OUT/pyc.txt"; done
  # what the interpreter's own start (site, .pth files) and the Engine's lazy imports cost here
  python3 -X importtime -c pass 2>&1 | sort -t'|' -k2 -n | tail -12 >> "$OUT/pyc.txt"
  python3 -X importtime -c "import numpy, reflex.engine, reflex.chat_template, reflex.gguf, reflex.models, \
reflex.store, reflex.tokenizer, reflex.backends.cuda_backend, reflex.models.llama" 2>&1 | awk -F'|' '$2+0 > 1500' \
    | grep -v '^import time: *self' >> "$OUT/pyc.txt"
  cat "$OUT/pyc.txt"
fi
T0=$(date +%s)
left() { echo $(( $1 - ($(date +%s) - T0) )); }   # seconds left of a stage budget

case $STAGE in
A)
  # llama.cpp builds in the background; meanwhile the fatbin, the GPU model tests (quiet CPU is not
  # needed for them) and the benchmark models; no timing runs while the build loads the CPU
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw --format=csv | tee "$OUT/gpu.txt"
  if [ -f .devdata/llama.cpp.tgz ] && [ ! -x "$LLAMA/llama-bench" ]; then
    mkdir -p build && tar xzf .devdata/llama.cpp.tgz -C build
    ( cd build/llama.cpp && cmake -B build -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_CURL=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DCMAKE_BUILD_TYPE=Release >/dev/null \
      && cmake --build build -j${JOBS:-14} --target llama-simple llama-bench llama-embedding ) > "$OUT/llama_build.txt" 2>&1 &
    BUILD=$!
  fi
  ( time python3 kernels/build.py --require ) > "$OUT/build.txt" 2>&1; tail -2 "$OUT/build.txt"
  if [ "${TESTS:-}" != none ]; then
    timeout "$(left 300)" python3 -m pytest -q -p no:cacheprovider ${TESTS:-tests/test_cuda_model.py tests/test_cuda_embed*.py} \
      -rfE 2>&1 | tail -60 > "$OUT/test_gpu.txt"
    tail -15 "$OUT/test_gpu.txt"
  fi
  M=/tmp/models; mkdir -p $M
  ONLY="smollm2-135m qwen3-0.6b minilm-l6" bash benchmarks/device_models.sh .devdata $M synth > "$OUT/synth_log.txt" 2>&1
  cat "$OUT/synth.txt"
  if [ -n "${BUILD:-}" ]; then
    ( sleep "$(left ${A_BUDGET:-580})"; kill -- -$BUILD 2>/dev/null ) & wait $BUILD; echo "llama build rc=$?"
    tail -3 "$OUT/llama_build.txt"
  fi
  ls "$LLAMA" 2>/dev/null | head
  ;;
B)
  # issue 4: cold TTFT (page cache warm, then dropped), prefill, decode; reflex vs llama-simple/llama-bench
  [ -x "$LLAMA/llama-bench" ] && export LLAMA_CPP=$LLAMA || echo "no llama.cpp build (machine not warm?)"
  M=/tmp/models
  timeout "$(left 560)" python3 -m reflex bench $M/smollm2-135m.gguf $M/qwen3-0.6b.gguf --backend cuda \
    --runs ${RUNS:-5} --drop-caches ${LLAMA_CPP:+--llama-cpp $LLAMA_CPP} ${PV:+--probe-variants} --json \
    > "$OUT/bench.json" 2> "$OUT/bench_log.txt"
  echo "bench rc=$?"
  python3 -c "import json, sys; from reflex.bench import table; print(table(json.load(open(sys.argv[1]))))" \
    "$OUT/bench.json" 2>&1 | tee "$OUT/bench_table.txt"
  tail -5 "$OUT/bench_log.txt"
  if [ "${EMBED:-}" = 1 ]; then  # C's embed half, when only one call is left
    timeout "$(left 590)" python3 benchmarks/bench_embed.py --model $M/minilm-l6.gguf --backend cuda --no-st \
      --runs ${RUNS:-5} ${LLAMA_CPP:+--llama-cpp $LLAMA_CPP} --json > "$OUT/bench_embed.json" 2> "$OUT/bench_embed_log.txt"
    echo "bench embed rc=$?"; cat "$OUT/bench_embed.json"; tail -3 "$OUT/bench_embed_log.txt"
  fi
  ;;
C)
  # issue 5: GPU cold embed + 256-token chunk throughput vs llama-embedding; then `reflex-rag ask` cold
  [ -x "$LLAMA/llama-bench" ] && export LLAMA_CPP=$LLAMA || echo "no llama.cpp build (machine not warm?)"
  M=/tmp/models; LC=${LLAMA_CPP:+--llama-cpp $LLAMA_CPP}
  timeout "$(left 300)" python3 benchmarks/bench_embed.py --model $M/minilm-l6.gguf --backend cuda --no-st \
    --runs ${RUNS:-5} $LC --json > "$OUT/bench_embed.json" 2> "$OUT/bench_embed_log.txt"
  echo "bench embed rc=$?"; cat "$OUT/bench_embed.json"; tail -3 "$OUT/bench_embed_log.txt"
  mkdir -p /tmp/pydoc && tar xJf .devdata/pydoc-subset.tar.xz -C /tmp/pydoc
  # greedy + repeat penalty 1.15: on the device by default now; =0 is the host path, for the ratio
  for pen in 1 0; do
    REFLEX_CUDA_DEVICE_PENALTY=$pen timeout "$(left 580)" python3 benchmarks/bench_rag.py ask --backend cuda \
      --runs 2 --corpus /tmp/pydoc --indexes-dir /tmp/rag_idx --embed-model $M/minilm-l6.gguf \
      --chat-model $M/smollm2-135m.gguf --min-score -1 > "$OUT/rag_ask_pen$pen.txt" 2>&1
    tail -14 "$OUT/rag_ask_pen$pen.txt"
  done
  ;;
esac
echo "stage $STAGE: $(( $(date +%s) - T0 )) s"
