"""Record reference outputs of transformers (an independent implementation) for tests/test_models_parity.py.

Cases (NAME -> what transformers loads):
  gemma3       the real Gemma-3-270M Q4_K_M GGUF: AutoModelForCausalLM.from_pretrained(models_dir,
               gguf_file=..., torch_dtype=float32) (transformers dequantizes it to fp32);
  qwen2, qwen3, qwen3moe the tiny random models saved by scripts/make_fixtures.py (their HF
               directory, fp32; every weight is exactly representable in the f16 fixture GGUF);
  qwen3moe_nonorm the qwen3moe model loaded with norm_topk_prob=False.
For each prompt: the prompt ids (transformers' tokenizer), 32 greedy new tokens (plain argmax with
transformers' KV cache, EOS not special) and a digest of the prompt logits: for each recorded row
(every prompt position; the last 4 for prompts longer than 64 tokens) the top-20 ids/values, the
values at 64 fixed probe ids and the row's max |logit|.

Usage: python scripts/make_model_refs.py [NAME ...]   -> tests/data/NAME_ref_models.json
Needs torch + transformers + gguf (not installed in CI).
"""
import json
import os
import sys

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = os.environ.get("REFLEX_MODELS", os.path.expanduser("~/.cache/reflex/models"))
FIXTURES = os.environ.get("REFLEX_FIXTURE_CACHE", os.path.expanduser("~/.cache/reflex/fixtures"))
N_NEW = 32
TOP = 20
N_PROBE = 64
LONG = 64  # prompts longer than this record only their last 4 rows

_TEXT = ("The history of the city begins with a small fishing village on the river. Over the centuries "
         "it grew into a trading port, then an industrial town with mills and railways, and finally a "
         "modern city known for its universities, museums and parks. ")
PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea,",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Water boils at a temperature of",
    "Here is a list of three fruits: apple, banana, and",
]
CASES = {
    # name: (source, path or gguf name, extra prompts)
    "gemma3": ("gguf", "gemma-3-270m-q4_k_m.gguf",
               ["<start_of_turn>user\nWhat is 2 + 2?<end_of_turn>\n<start_of_turn>model\n",
                # > 512 tokens: crosses gemma3's sliding window (512) in the local layers
                _TEXT * 12 + "In summary, the city"]),
    "qwen2": ("hf", "qwen2", ["<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n<|im_start|>assistant\n"]),
    "qwen3": ("hf", "qwen3", ["<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n<|im_start|>assistant\n"]),
    "qwen3moe": ("hf", "qwen3moe", ["<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n<|im_start|>assistant\n"]),
    # llama with llama.attention.sliding_window = 6 (Mistral-style); every prompt here is longer
    "mistral_swa": ("hf", "mistral_swa", []),
    # Gemma 4 text: sliding window 4, KV-shared layers, PLE, k == v, softcapping (see make_fixtures)
    "gemma4": ("hf", "gemma4", ["<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n<|im_start|>assistant\n"]),
    # Gemma 4 MoE layers (dense MLP + 4 routed experts, top-2), v_proj on global layers
    "gemma4moe": ("hf", "gemma4moe", ["<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n<|im_start|>assistant\n"]),
    # the same weights with norm_topk_prob false (the top-k routing weights not renormalized)
    "qwen3moe_nonorm": ("hf", "qwen3moe", []),
    # Gated DeltaNet + gated full-attention hybrid; the long prompt runs the chunked prefill over > 1 chunk (64)
    "qwen35": ("hf", "qwen35", ["<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n<|im_start|>assistant\n",
                                _TEXT * 2]),
    # MLA (q_lora_rank set) + YaRN + 2 dense / 2 MoE layers with sigmoid scoring, exp_probs_b, shared expert
    "deepseek2": ("hf", "deepseek2", ["<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n<|im_start|>assistant\n"]),
    # V2-Lite layout: no q_lora_rank, plain RoPE, softmax scoring, no bias / renormalization, 2 shared experts
    "deepseek2_lite": ("hf", "deepseek2_lite", []),
    # the deepseek2 weights with group-limited routing: 2 groups of 2 experts, the best 1 group kept
    "deepseek2_group": ("hf", "deepseek2", []),
    # Mamba-2 + NoPE attention hybrid with MoE + shared expert and Granite multipliers; HF's prefill is
    # the chunked SSD scan (chunk 4), so the long prompt crosses many chunks
    "granitehybrid": ("hf", "granitehybrid", ["<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n<|im_start|>assistant\n",
                                              _TEXT]),
}

# config changes a case loads the saved HF model with (the GGUF side gets the same change in its test)
CONFIG_OVERRIDES = {"deepseek2_group": {"n_group": 2, "topk_group": 1}}


def _load(name):
    src, where, _ = CASES[name]
    if src == "gguf":
        tok = AutoTokenizer.from_pretrained(MODELS, gguf_file=where)
        model = AutoModelForCausalLM.from_pretrained(MODELS, gguf_file=where, torch_dtype=torch.float32)
        return tok, model, where
    d = os.path.join(FIXTURES, where)
    from transformers.tokenization_utils_tokenizers import TokenizersBackend

    tok = TokenizersBackend.from_pretrained(d)  # as saved (see make_fixtures.py on Qwen2Tokenizer)
    kw = {"norm_topk_prob": False} if name.endswith("_nonorm") else {}
    kw = CONFIG_OVERRIDES.get(name, kw)
    model = AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.float32, **kw)
    return tok, model, f"tests/data/fixtures/{where}.gguf"


def record(name):
    torch.manual_seed(0)
    tok, model, model_file = _load(name)
    model.eval()
    n_vocab = model.config.vocab_size
    probe = np.random.default_rng(1234).choice(n_vocab, N_PROBE, replace=False)
    cases = []
    for prompt in PROMPTS + CASES[name][2]:
        ids = tok(prompt, return_tensors="pt").input_ids
        T = ids.shape[1]
        with torch.no_grad():
            out = model(ids, use_cache=True)
            logits = out.logits[0].double().numpy()             # (T, n_vocab)
            past = out.past_key_values
            nxt = out.logits[0, -1].argmax().view(1, 1)
            new = []
            for _ in range(N_NEW):
                new.append(int(nxt))
                out = model(nxt, past_key_values=past, use_cache=True)
                past = out.past_key_values
                nxt = out.logits[0, -1].argmax().view(1, 1)
        rows = list(range(T)) if T <= LONG else list(range(T - 4, T))
        top_ids, top_vals, probe_vals, max_abs, margin = [], [], [], [], []
        for r in rows:
            row = logits[r]
            order = np.argsort(-row, kind="stable")[:TOP]
            top_ids.append(order.tolist())
            top_vals.append([float(row[i]) for i in order])
            probe_vals.append([float(row[i]) for i in probe])
            max_abs.append(float(np.abs(row).max()))
            margin.append(float(row[order[0]] - row[order[1]]))
        cases.append({
            "prompt": prompt,
            "prompt_ids": ids[0].tolist(),
            "greedy_ids": new,
            "greedy_text": tok.decode(new),
            "logits": {"rows": rows, "n_vocab": int(n_vocab), "top_ids": top_ids, "top_values": top_vals,
                       "probe_values": probe_vals, "max_abs": max_abs, "top1_margin": margin},
        })
        print(name, T, repr(prompt[:40]), "->", repr(tok.decode(new)), f"min margin {min(margin):.3g}")
    outp = os.path.join(ROOT, "tests", "data", f"{name}_ref_models.json")
    with open(outp, "w") as fh:
        json.dump({"model": model_file, "source": "transformers " + __import__("transformers").__version__,
                   "n_new": N_NEW, "probe_ids": probe.tolist(), "cases": cases}, fh)
    print("wrote", outp)


def main():
    for name in sys.argv[1:] or list(CASES):
        record(name)


if __name__ == "__main__":
    main()
