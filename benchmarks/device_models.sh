#!/usr/bin/env bash
# Device benchmark models: real shapes, random weights, real tokenizers from vocab-only GGUFs
# (the real files are over the 64 MiB a device call carries), then the benchmarks that use them.
#
# Usage (device, repo root): bash benchmarks/device_models.sh VOCAB_DIR OUT_DIR [synth|bench|all]
#   VOCAB_DIR holds smollm2-vocab.gguf and minilm-vocab.gguf (`python3 -m reflex synth REAL OUT
#   --vocab-only`; .devdata/ has both). Models go to OUT_DIR, logs and JSON to $OUT (or /tmp/out).
#   LLAMA_CPP=<llama.cpp build>/bin adds llama.cpp on the same files; its build must include the
#   targets llama-simple llama-bench llama-embedding (GUIDE.md section 5 has the cmake line).
#   ONLY="qwen3moe minilm-l6" synthesizes only those. RUNS (default 5) cold runs per engine; DROP=1 adds --drop-caches to `reflex bench`.
# Models (sizes as written here with the smollm2 vocab, 49,152 tokens):
#   smollm2-135m.gguf   llama, Q4_1 (+Q8_0 embd)            ~97 MB
#   qwen3-0.6b.gguf     qwen3, Q4_K_M-like                   ~304 MB
#   qwen3moe.gguf       qwen3moe, 30B-A3B layer shapes x 4   ~1.65 GB (2.69B params; one worker per CPU)
#   minilm-l6.gguf      bert, all-MiniLM-L6-v2 shapes, F32   ~90 MB (WordPiece vocab, 30,522)
set -u
VOCAB=${1:?usage: device_models.sh VOCAB_DIR OUT_DIR [synth|bench|all]}
MODELS=${2:?usage: device_models.sh VOCAB_DIR OUT_DIR [synth|bench|all]}
WHAT=${3:-all}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" "$MODELS"
export PYTHONUNBUFFERED=1
# the synthetic-model writer needs the gguf package (not installed on the device: carry .whl/)
python3 -c "import gguf" 2>/dev/null || {
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:$PWD; }
export PYTHONPATH=${PYTHONPATH:-$PWD}

synth() {  # synth VOCAB_FILE NAME PRESET: one model, its time and size in $OUT/synth.txt
  case " ${ONLY:-$2} " in *" $2 "*) ;; *) return 0;; esac
  local t0=$(date +%s%N)
  python3 -m reflex synth "$VOCAB/$1" "$MODELS/$2.gguf" --preset "$3" --json >> "$OUT/synth.jsonl" 2>> "$OUT/synth_err.txt" \
    || { echo "synth $2 FAILED (see synth_err.txt)" | tee -a "$OUT/synth.txt"; return 1; }
  echo "$2 ($3): $(( ($(date +%s%N) - t0) / 1000000 )) ms wall, $(stat -c %s "$MODELS/$2.gguf") bytes" | tee -a "$OUT/synth.txt"
}

if [ "$WHAT" = synth ] || [ "$WHAT" = all ]; then
  synth smollm2-vocab.gguf smollm2-135m smollm2-135m
  synth smollm2-vocab.gguf qwen3-0.6b qwen3-0.6b
  synth smollm2-vocab.gguf qwen3moe qwen3moe-30b-a3b-small
  synth minilm-vocab.gguf minilm-l6 minilm-l6
  df -h "$MODELS" | tail -1 >> "$OUT/synth.txt"
fi

if [ "$WHAT" = bench ] || [ "$WHAT" = all ]; then
  LC=${LLAMA_CPP:+--llama-cpp $LLAMA_CPP}
  # issue 8: decode tok/s + cold TTFT, Qwen3-MoE-shaped model, reflex (CUDA) vs llama.cpp (-ngl 99)
  timeout 400 python3 -m reflex bench "$MODELS/qwen3moe.gguf" --backend cuda --runs "${RUNS:-5}" \
    ${DROP:+--drop-caches} $LC --json > "$OUT/bench_moe.json" 2> "$OUT/bench_moe_log.txt"
  echo "bench moe rc=$?"
  python3 -c "import json, sys; from reflex.bench import table; print(table(json.load(open(sys.argv[1]))))" \
    "$OUT/bench_moe.json" 2>&1 | tee "$OUT/bench_moe_table.txt"
  # issue 5: cold embed of one sentence + embeddings/s of 256-token chunks, vs llama-embedding
  timeout 300 python3 benchmarks/bench_embed.py --model "$MODELS/minilm-l6.gguf" --backend cuda --no-st \
    --runs "${RUNS:-5}" $LC --json > "$OUT/bench_embed.json" 2> "$OUT/bench_embed_log.txt"
  echo "bench embed rc=$?"; cat "$OUT/bench_embed.json"; tail -3 "$OUT/bench_embed_log.txt"
fi
