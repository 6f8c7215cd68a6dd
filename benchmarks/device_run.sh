#!/usr/bin/env bash
# One device call: build the kernels, run every GPU test, make the benchmark models, benchmark.
# Usage (device): bash benchmarks/device_run.sh [tests|bench|all|models]   logs go to $OUT (or /tmp/out)
# models: benchmarks/device_models.sh .devdata /tmp/models (synthetic smollm2/qwen3/qwen3moe/minilm, then
# reflex bench on the MoE model and bench_embed.py on the MiniLM; LLAMA_CPP=<build>/bin adds llama.cpp);
# needs .devdata/minilm-vocab.gguf too
# Needs .whl/gguf-*.whl (the writer for synthetic models) and .devdata/smollm2-vocab.gguf
# (`reflex synth SmolLM2.gguf .devdata/smollm2-vocab.gguf --vocab-only`) carried along.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
WHAT=${1:-all}
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site:$PWD
export REFLEX_VOCAB_GGUF=$PWD/.devdata/smollm2-vocab.gguf REFLEX_PARITY_REPORT=$OUT/parity.jsonl
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total,clocks.sm,power.draw --format=csv | tee $OUT/gpu.txt
( time python3 kernels/build.py ) 2>&1 | tee $OUT/build.txt
if [ "$WHAT" = tests ] || [ "$WHAT" = all ]; then
  timeout 420 python3 -m pytest -q -x tests/test_cuda_build.py tests/test_cuda_kernels.py 2>&1 | tail -40 > $OUT/test_kernels.txt
  tail -5 $OUT/test_kernels.txt
  timeout 420 python3 -m pytest -q -s tests/test_cuda_model.py 2>&1 | tail -60 > $OUT/test_model.txt
  tail -8 $OUT/test_model.txt
fi
if [ "$WHAT" = bench ] || [ "$WHAT" = all ]; then
  mkdir -p /tmp/models
  python3 -m reflex synth .devdata/smollm2-vocab.gguf /tmp/models/smollm2-135m-q4_1-synth.gguf --preset smollm2-135m
  M="/tmp/models/smollm2-135m-q4_1-synth.gguf"
  if [ -f reflex/models/qwen3.py ]; then
    python3 -m reflex synth .devdata/smollm2-vocab.gguf /tmp/models/qwen3-0.6b-q4_k_m-synth.gguf --preset qwen3-0.6b
    M="$M /tmp/models/qwen3-0.6b-q4_k_m-synth.gguf"
  fi
  # the product's command; --llama-cpp with LLAMA_CPP=<build>/bin (GUIDE.md has the build recipe)
  timeout 400 python3 -m reflex bench $M --backend cuda --runs ${RUNS:-7} ${DROP:+--drop-caches} ${NOCOLD:+--no-cold} \
    ${LLAMA_CPP:+--llama-cpp $LLAMA_CPP} ${VARIANTS:+--probe-variants} --json > $OUT/bench.json 2> $OUT/bench_log.txt
  python3 -c "import json, sys; from reflex.bench import table; print(table(json.load(open(sys.argv[1]))))" \
    $OUT/bench.json 2>&1 | tee $OUT/bench_table.txt
  tail -5 $OUT/bench_log.txt
fi
if [ "$WHAT" = models ]; then
  bash benchmarks/device_models.sh .devdata /tmp/models all
fi
if [ "$WHAT" = profile ] || [ "${PROFILE:-}" = 1 ]; then
  NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  M=${PROFILE_MODEL:-/tmp/models/smollm2-135m-q4_1-synth.gguf}
  [ -f $M ] || python3 -m reflex synth .devdata/smollm2-vocab.gguf $M --preset smollm2-135m
  timeout 200 $NCU --clock-control none --metrics gpu__time_duration.sum --csv --launch-skip 700 --launch-count 560 \
    python3 benchmarks/profile_decode.py $M 6 > $OUT/ncu.csv 2> $OUT/ncu_err.txt
  python3 - $OUT/ncu.csv <<'PY' | tee $OUT/ncu_summary.txt
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
hdr = rows[0]; ki = hdr.index("Kernel Name"); vi = hdr.index("Metric Value"); ii = hdr.index("ID")
t = collections.defaultdict(list)
for r in rows[1:]:
    try: t[r[ki].split("(")[0]].append(float(r[vi].replace(",", "")))
    except ValueError: pass
tot = sum(sum(v) for v in t.values()); n = sum(len(v) for v in t.values())
print(f"{n} kernels, {tot/1e3:.1f} us total ({tot/1e3/2:.1f} us per step if 2 steps)")
for k, v in sorted(t.items(), key=lambda kv: -sum(kv[1])):
    print(f"{k:34s} n={len(v):4d} avg={sum(v)/len(v)/1e3:7.2f} us  total={sum(v)/1e3:8.1f} us")
PY
fi
