"""Record reference outputs for the llama architecture from transformers (independent implementation).

transformers dequantizes the GGUF to float32 and runs its own LlamaForCausalLM. For each prompt we
record the prompt token ids (transformers' tokenizer, BOS included when it adds one), 32 greedy new
tokens (plain argmax, EOS not special), and the last-position prompt logits (top-50 values/ids plus summary stats).

Usage: python scripts/make_llama_refs.py   -> tests/data/llama_ref_smollm2.json
Needs torch + transformers + gguf (not installed in CI).
"""
import json
import os

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = os.environ.get("REFLEX_MODELS", os.path.expanduser("~/.cache/reflex/models"))
NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
OUT = os.path.join(ROOT, "tests", "data", "llama_ref_smollm2.json")
N_NEW = 32
TOP = 50

PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea,",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Water boils at a temperature of",
    "Here is a list of three fruits: apple, banana, and",
    "<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n<|im_start|>assistant\n",
]


def main():
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(MODELS, gguf_file=NAME)
    model = AutoModelForCausalLM.from_pretrained(MODELS, gguf_file=NAME, torch_dtype=torch.float32)
    model.eval()
    cases = []
    for prompt in PROMPTS:
        ids = tok(prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            logits = model(ids).logits[0, -1].double().numpy()
            # plain argmax loop: generate(min_new_tokens=...) would mask EOS, we want raw greedy
            seq = ids
            for _ in range(N_NEW):
                nxt = model(seq).logits[0, -1].argmax()
                seq = torch.cat([seq, nxt.view(1, 1)], dim=1)
        new = seq[0, ids.shape[1]:].tolist()
        assert len(new) == N_NEW, len(new)
        order = np.argsort(-logits, kind="stable")[:TOP]
        cases.append({
            "prompt": prompt,
            "prompt_ids": ids[0].tolist(),
            "greedy_ids": new,
            "greedy_text": tok.decode(new),
            "last_logits": {
                "top_ids": order.tolist(),
                "top_values": [float(logits[i]) for i in order],
                "n_vocab": int(logits.shape[0]),
                "max_abs": float(np.abs(logits).max()),
                "mean": float(logits.mean()),
                "std": float(logits.std()),
                "sum_abs": float(np.abs(logits).sum()),
            },
        })
        print(repr(prompt), "->", repr(tok.decode(new)))
    with open(OUT, "w") as fh:
        json.dump({"model": NAME, "source": "transformers " + __import__("transformers").__version__,
                   "n_new": N_NEW, "cases": cases}, fh, indent=1)
    print("wrote", OUT)


if __name__ == "__main__":
    main()
