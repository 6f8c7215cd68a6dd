"""Record system1 reference log-probs on SmolLM2-135M-Instruct Q4_1 from transformers.

transformers dequantizes the GGUF to float32 (its own GGUF loader) and runs its own
LlamaForCausalLM; its own tokenizer (read from the same GGUF) tokenizes. For every case we apply
the boundary rule of reflex/system1.py with *transformers'* tokenizer (candidate ids =
tok(context + cand)[len(tok(context)):] when tok(context) is a prefix and the candidate adds a
token, else tok(cand) without special tokens), run one full causal forward over context +
candidate per candidate (no cache, no mask tricks) and record log_softmax of each candidate token.

Usage: python scripts/make_system1_refs.py   -> tests/data/system1_ref_smollm2.json
Needs torch + transformers + gguf (not installed in CI).
"""
import json
import os
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from reflex.classify import render_prompt  # noqa: E402  (string formatting only)

MODELS = os.environ.get("REFLEX_MODELS", os.path.expanduser("~/.cache/reflex/models"))
NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
OUT = os.path.join(ROOT, "tests", "data", "system1_ref_smollm2.json")

CASES = [
    ("The capital of France is",
     [" Paris", " Lyon", " a city in Europe", " a city of lights", " Paris, of course."]),
    ("Q: What is the boiling point of water at sea level?\nA: The answer is: ",
     ["100 degrees Celsius", "212 degrees Fahrenheit", "yes", "0"]),
    ("def add(a, b):\n    return",
     [" a + b", " a - b", " a * b", "\n"]),
    ("She opened the door and", [" smiled", " screamed", " smiled at him", " smiled at her"]),
]
CLASSIFY = [
    ("I absolutely loved this movie, it was wonderful.", ["positive", "negative"]),
    ("The senate passed the new budget bill on Tuesday.", ["sports", "politics", "technology"]),
    ("The striker scored twice in the final minutes.", ["football match report", "cooking recipe", "weather"]),
]


def cand_ids(tok, context, ctx, cand):
    full = tok(context + cand).input_ids
    if len(full) > len(ctx) and full[:len(ctx)] == ctx:
        return full[len(ctx):], "continuation"
    return tok(cand, add_special_tokens=False).input_ids, "separate"


def logprobs(model, ctx, ids):
    x = torch.tensor([ctx + ids])
    with torch.no_grad():
        lp = torch.log_softmax(model(x).logits[0].double(), dim=-1)  # (T, n_vocab)
    return [float(lp[len(ctx) - 1 + k, t]) for k, t in enumerate(ids)]


def main():
    tok = AutoTokenizer.from_pretrained(MODELS, gguf_file=NAME)
    model = AutoModelForCausalLM.from_pretrained(MODELS, gguf_file=NAME, torch_dtype=torch.float32)
    model.eval()
    cases = []
    for context, cands in CASES:
        ctx = tok(context).input_ids
        out = []
        for c in cands:
            ids, how = cand_ids(tok, context, ctx, c)
            out.append({"text": c, "token_ids": ids, "boundary": how, "logprobs": logprobs(model, ctx, ids)})
        cases.append({"context": context, "context_ids": ctx, "candidates": out})
    cls = []
    for text, labels in CLASSIFY:
        prompt = render_prompt(text, labels)
        ctx = tok(prompt).input_ids
        totals, n_tokens = {}, {}
        for lab in labels:
            ids, _ = cand_ids(tok, prompt, ctx, " " + lab)
            totals[lab] = sum(logprobs(model, ctx, ids))
            n_tokens[lab] = len(ids)
        cls.append({"text": text, "labels": labels, "prompt": prompt, "totals": totals, "n_tokens": n_tokens})
    with open(OUT, "w") as fh:
        json.dump({"model": NAME, "reference": "transformers fp32 GGUF loader, full forward per candidate",
                   "cases": cases, "classify": cls}, fh, indent=1)
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
