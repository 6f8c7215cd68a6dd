#!/usr/bin/env bash
# A whole device session in three calls of < 10 minutes each, issued back to back so the machine
# stays warm (build/llama.cpp, the fatbin and /tmp/models survive between them):
#   A  llama.cpp build (background, sm_90) | fatbin for every target, every GPU test, kernel benches
#   B  reflex bench SmolLM2- and Qwen3-shaped files vs llama-simple/llama-bench; `reflex-rag ask` cold
#      on the GPU over the eval pages with synthetic models of the real shapes
#   C  Qwen3-MoE-shaped bench vs llama.cpp; GPU cold embed + chunk throughput vs llama-embedding
# Usage (device, repo root): bash benchmarks/device_session.sh A|B|C    results in $OUT (or /tmp/out)
# Carry (git-ignored, made here; see the README of benchmarks/device_run.sh for the vocab files):
#   A: .whl .devdata/smollm2-vocab.gguf .devdata/minilm-vocab.gguf .devdata/llama.cpp.tgz
#      (llama-cpp-python 0.3.36's vendor/llama.cpp without models/ docs/ media/ tests/ benches/)
#   B, C: .whl .devdata/smollm2-vocab.gguf .devdata/minilm-vocab.gguf .devdata/faiss312.tar.xz
#      (faiss-cpu's abi3 wheel unpacked) .devdata/pydoc-subset.tar.xz (the pages that
#      scripts/rag_eval_questions.json includes, from Debian's python3-doc)
set -u
STAGE=${1:?usage: device_session.sh A|B|C}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 REFLEX_VOCAB_GGUF=$PWD/.devdata/smollm2-vocab.gguf REFLEX_PARITY_REPORT=$OUT/parity.jsonl
mkdir -p /tmp/site
python3 -c "import gguf" 2>/dev/null || python3 -m pip install -q --no-index --no-deps --no-compile \
  --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
[ -f .devdata/faiss312.tar.xz ] && [ ! -d /tmp/site/faiss ] && tar xJf .devdata/faiss312.tar.xz -C /tmp/site
export PYTHONPATH=/tmp/site:$PWD
LLAMA=$PWD/build/llama.cpp/build/bin
T0=$(date +%s)
left() { echo $(( $1 - ($(date +%s) - T0) )); }   # seconds left of a stage budget

case $STAGE in
A)
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw --format=csv | tee "$OUT/gpu.txt"
  if [ -f .devdata/llama.cpp.tgz ] && [ ! -x "$LLAMA/llama-bench" ]; then
    mkdir -p build && tar xzf .devdata/llama.cpp.tgz -C build
    ( cd build/llama.cpp && cmake -B build -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_CURL=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DCMAKE_BUILD_TYPE=Release >/dev/null \
      && cmake --build build -j12 --target llama-simple llama-bench llama-embedding ) > "$OUT/llama_build.txt" 2>&1 &
    BUILD=$!
  fi
  ( time python3 kernels/build.py --require ) > "$OUT/build.txt" 2>&1; tail -2 "$OUT/build.txt"
  timeout "$(left 400)" python3 -m pytest -q -p no:cacheprovider tests/test_cuda_*.py tests/test_kv_f16_parity.py \
    -rfE 2>&1 | tail -80 > "$OUT/test_gpu.txt"
  tail -25 "$OUT/test_gpu.txt"
  for b in bench_matvec bench_attention; do
    [ -f benchmarks/$b.py ] && timeout 60 python3 benchmarks/$b.py > "$OUT/$b.txt" 2>&1; tail -40 "$OUT/$b.txt"
  done
  if [ -n "${BUILD:-}" ]; then
    ( sleep "$(left 560)"; kill -- -$BUILD 2>/dev/null ) & wait $BUILD; echo "llama build rc=$?"
    tail -3 "$OUT/llama_build.txt"
  fi
  ls "$LLAMA" 2>/dev/null | head
  ;;
B)
  [ -x "$LLAMA/llama-bench" ] && export LLAMA_CPP=$LLAMA || echo "no llama.cpp build (machine not warm?)"
  RUNS=${RUNS:-5} DROP=1 timeout "$(left 380)" bash benchmarks/device_run.sh bench > "$OUT/run_bench.txt" 2>&1
  tail -30 "$OUT/run_bench.txt"
  M=/tmp/models; mkdir -p $M /tmp/pydoc
  tar xJf .devdata/pydoc-subset.tar.xz -C /tmp/pydoc
  [ -f $M/minilm-l6.gguf ] || python3 -m reflex synth .devdata/minilm-vocab.gguf $M/minilm-l6.gguf --preset minilm-l6
  [ -f $M/smollm2-135m-q4_1-synth.gguf ] || python3 -m reflex synth .devdata/smollm2-vocab.gguf \
    $M/smollm2-135m-q4_1-synth.gguf --preset smollm2-135m
  timeout "$(left 560)" python3 benchmarks/bench_rag.py ask --backend cuda --runs 2 --corpus /tmp/pydoc \
    --indexes-dir /tmp/rag_idx --embed-model $M/minilm-l6.gguf --chat-model $M/smollm2-135m-q4_1-synth.gguf \
    --min-score -1 > "$OUT/rag_ask.txt" 2>&1
  tail -25 "$OUT/rag_ask.txt"
  # the same with the repeat penalty on the device (opt-in until its GPU tests pass in stage A)
  REFLEX_CUDA_DEVICE_PENALTY=1 timeout "$(left 580)" python3 benchmarks/bench_rag.py ask --backend cuda --runs 2 \
    --corpus /tmp/pydoc --indexes-dir /tmp/rag_idx --embed-model $M/minilm-l6.gguf \
    --chat-model $M/smollm2-135m-q4_1-synth.gguf --min-score -1 > "$OUT/rag_ask_devpen.txt" 2>&1
  tail -20 "$OUT/rag_ask_devpen.txt"
  ;;
C)
  [ -x "$LLAMA/llama-bench" ] && export LLAMA_CPP=$LLAMA || echo "no llama.cpp build (machine not warm?)"
  ONLY="qwen3moe minilm-l6" RUNS=${RUNS:-5} timeout "$(left 560)" bash benchmarks/device_models.sh .devdata /tmp/models all \
    > "$OUT/models.txt" 2>&1
  tail -30 "$OUT/models.txt"
  ;;
esac
echo "stage $STAGE: $(( $(date +%s) - T0 )) s"
