"""Every decoder architecture through the same checks, from one table of cases (NumPy backend).

1. Reference parity -- against outputs recorded from transformers (an independent implementation)
   by scripts/make_model_refs.py (gemma3, qwen2, qwen3) and scripts/make_llama_refs.py (llama); CI
   checks against these recordings, it does not run transformers. Greedy: the 32 new tokens are
   identical. Logits: relative error = max |ours - ref| / max |ref|, the max over every recorded
   entry of every recorded prompt row (top-20 values and 64 fixed probe ids per row) divided by the
   largest |logit| of those rows, must be < 1e-3.
2. Prefill == step-by-step decode: logits of a sequence run at once equal those of running it one
   token at a time, within 1e-4 relative.
3. Tree mask: context + two branches in one forward (branch positions restart after the context,
   `attn_mask` hides each branch from the other) equals two separate forwards, within 1e-4 relative;
   for gemma3 also with a sliding window of 3 so that the window test on positions is exercised.
   Models with recurrent layers (Mamba-2, Gated DeltaNet) cannot hide one branch from another inside
   a recurrence; they say so with `model.tree_mask = False` and their caches offer
   `snapshot()` / `restore(snap)`. For them the check is: context once, snapshot, branch a,
   restore, branch b -- each equal to its separate forward (system1 scores them the same way).

Adding an architecture = a model file, an entry in CASES, and its recipe in scripts/make_fixtures.py
(synthetic) or its reference prompts in scripts/make_model_refs.py.
Real models (SmolLM2, Gemma-3-270M) are skipped when not in $REFLEX_MODELS; fixtures are committed.
"""
import json
import os

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "data")
MODELS = os.environ.get("REFLEX_MODELS", os.path.expanduser("~/.cache/reflex/models"))

# name -> (GGUF file, recorded reference)
CASES = {
    "llama": (os.path.join(MODELS, "SmolLM2-135M-Instruct.Q4_1.gguf"), "llama_ref_smollm2.json"),
    "gemma3": (os.path.join(MODELS, "gemma-3-270m-q4_k_m.gguf"), "gemma3_ref_models.json"),
    "qwen2": (os.path.join(DATA, "fixtures", "qwen2.gguf"), "qwen2_ref_models.json"),
    "qwen3": (os.path.join(DATA, "fixtures", "qwen3.gguf"), "qwen3_ref_models.json"),
    "qwen3moe": (os.path.join(DATA, "fixtures", "qwen3moe.gguf"), "qwen3moe_ref_models.json"),
    # Gated DeltaNet + gated full-attention hybrid (recurrent: fork check via cache snapshots)
    "qwen35": (os.path.join(DATA, "fixtures", "qwen35.gguf"), "qwen35_ref_models.json"),
    # llama with llama.attention.sliding_window = 6 (Mistral-style GQA + SWA), vs MistralForCausalLM
    "mistral_swa": (os.path.join(DATA, "fixtures", "mistral_swa.gguf"), "mistral_swa_ref_models.json"),
    # Granite 4.0-H: Mamba-2 + NoPE attention, MoE + shared expert, Granite multipliers (recurrent: fork check)
    "granitehybrid": (os.path.join(DATA, "fixtures", "granitehybrid.gguf"), "granitehybrid_ref_models.json"),
    # MLA (latent KV cache, absorbed k_b/v_b) + YaRN + MoE with sigmoid scoring, exp_probs_b, shared expert
    "deepseek2": (os.path.join(DATA, "fixtures", "deepseek2.gguf"), "deepseek2_ref_models.json"),
    # V2-Lite layout: plain attn_q, no RoPE scaling, softmax scoring, 2 shared experts
    "deepseek2_lite": (os.path.join(DATA, "fixtures", "deepseek2_lite.gguf"), "deepseek2_lite_ref_models.json"),
    # per-layer SWA pattern and head dims, proportional RoPE, k == v, KV-shared layers, PLE, softcap
    "gemma4": (os.path.join(DATA, "fixtures", "gemma4.gguf"), "gemma4_ref_models.json"),
    # gemma4 MoE layers: dense MLP + routed experts (router scale, per-expert scale, fused gate_up)
    "gemma4moe": (os.path.join(DATA, "fixtures", "gemma4moe.gguf"), "gemma4moe_ref_models.json"),
}


def _ref(name):
    with open(os.path.join(DATA, CASES[name][1])) as fh:
        ref = json.load(fh)
    for c in ref["cases"]:
        if "last_logits" in c:  # make_llama_refs.py's format: the last prompt row only
            ll = c["last_logits"]
            c["logits"] = {"rows": [len(c["prompt_ids"]) - 1], "n_vocab": ll["n_vocab"],
                           "top_ids": [ll["top_ids"]], "top_values": [ll["top_values"]],
                           "probe_values": [[]], "max_abs": [ll["max_abs"]]}
    ref.setdefault("probe_ids", [])
    return ref


def _params():
    out = []
    for name, (path, _) in CASES.items():
        mark = pytest.mark.skipif(not os.path.exists(path), reason=f"model not found: {path}")
        if not os.path.exists(os.path.join(DATA, CASES[name][1])):
            out.append(pytest.param(name, -1, id=f"{name}-no-reference"))  # fails: record it
            continue
        for i in range(len(_ref(name)["cases"])):
            out.append(pytest.param(name, i, marks=mark, id=f"{name}-{i}"))
    return out


def _names():
    return [pytest.param(n, marks=pytest.mark.skipif(not os.path.exists(p), reason=f"model not found: {p}"))
            for n, (p, _) in CASES.items()]


_MODELS = {}


def _model(name):
    if name not in _MODELS:
        from reflex.models import load_model

        _MODELS.clear()  # one real model in memory at a time
        _MODELS[name] = load_model(CASES[name][0], "numpy")
    return _MODELS[name]


def _rows_logits(model, ids, rows):
    """Prompt logits at `rows` (R, n_vocab), without the full (T, n_vocab) matrix of a long prompt."""
    b = model.backend
    h = model.forward(ids, model.new_cache(len(ids)), output="hidden")  # (T, n_embd)
    head = getattr(model, "lm_head", None)  # the model's own head where it is more than a matmul
    return b.to_numpy(head(h[rows]) if callable(head) else b.matmul(h[rows], model.output))


def _recorded_rel_err(ref, case, ours, max_abs=False) -> float:
    """Largest |ours - recorded| over each recorded row's top ids and the probe ids (and, with
    max_abs, the row's max |logit|), relative to the largest recorded |logit|."""
    d = case["logits"]
    probe = np.array(ref["probe_ids"], dtype=np.int64)
    err = 0.0
    for r in range(len(d["rows"])):
        err = max(err, np.max(np.abs(ours[r, d["top_ids"][r]] - np.array(d["top_values"][r]))))
        if len(probe) and d["probe_values"][r]:
            err = max(err, np.max(np.abs(ours[r, probe] - np.array(d["probe_values"][r]))))
        if max_abs:
            err = max(err, abs(np.abs(ours[r]).max() - d["max_abs"][r]))
    return err / max(d["max_abs"])


def _greedy(model, ids, n_new):
    cache = model.new_cache(len(ids) + n_new)
    lg = model.forward(ids, cache, last_only=True)
    out = []
    for _ in range(n_new):
        out.append(int(np.argmax(lg[-1])))
        lg = model.forward([out[-1]], cache)
    return out


@pytest.mark.parametrize("name,i", _params())
def test_reference_parity(name, i):
    assert i >= 0, f"no recorded reference {CASES[name][1]}: run scripts/make_model_refs.py {name}"
    ref = _ref(name)
    case = ref["cases"][i]
    model = _model(name)
    d = case["logits"]
    assert model.n_vocab == d["n_vocab"]
    ours = _rows_logits(model, case["prompt_ids"], d["rows"])         # (R, n_vocab)
    rel = _recorded_rel_err(ref, case, ours, max_abs=True)
    assert rel < 1e-3, f"prompt logits rel err {rel:.2e}"
    out = _greedy(model, case["prompt_ids"], len(case["greedy_ids"]))
    assert out == case["greedy_ids"], (
        f"first divergence at {next(j for j, (a, b) in enumerate(zip(out, case['greedy_ids'])) if a != b)}")


def _rel(a, b):
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


@pytest.mark.parametrize("name", _names())
def test_prefill_equals_decode(name):
    model = _model(name)
    case = _ref(name)["cases"][0]
    seq = case["prompt_ids"] + case["greedy_ids"][:8]
    full = model.forward(seq, model.new_cache(len(seq)))              # (T, n_vocab)
    cache = model.new_cache(len(seq))
    steps = np.concatenate([model.forward([t], cache) for t in seq])  # (T, n_vocab)
    assert _rel(steps, full) < 1e-4
    lo = model.forward(seq, model.new_cache(len(seq)), last_only=True)
    assert lo.shape == (1, full.shape[1]) and _rel(lo[0], full[-1]) < 1e-4


def _fork_check(model, ctx, a, b):
    C, A, B = len(ctx), len(a), len(b)
    cache = model.new_cache(C + A + B)  # the last check runs a then b without a restore
    model.forward(ctx, cache)
    snap = cache.snapshot()
    got_a = model.forward(a, cache)
    cache.restore(snap)
    got_b = model.forward(b, cache)
    assert _rel(got_a, model.forward(ctx + a, model.new_cache(C + A))[C:]) < 1e-4
    assert _rel(got_b, model.forward(ctx + b, model.new_cache(C + B))[C:]) < 1e-4
    # and restoring really rewinds: without it, b would continue after a
    cache.restore(snap)
    model.forward(a, cache)
    assert _rel(model.forward(b, cache), got_b) > 1e-3


def _tree_check(model, ctx, a, b):
    if not getattr(model, "tree_mask", True):
        return _fork_check(model, ctx, a, b)
    C, A, B = len(ctx), len(a), len(b)
    cache = model.new_cache(C + A + B)
    model.forward(ctx, cache)
    mask = np.zeros((A + B, C + A + B), dtype=bool)
    mask[:, :C] = True
    mask[:A, C:C + A] = np.tril(np.ones((A, A), dtype=bool))
    mask[A:, C + A:] = np.tril(np.ones((B, B), dtype=bool))
    pos = np.concatenate([np.arange(C, C + A), np.arange(C, C + B)])
    tree = model.forward(a + b, cache, positions=pos, attn_mask=mask)   # (A+B, n_vocab)
    sep_a = model.forward(ctx + a, model.new_cache(C + A))[C:]
    sep_b = model.forward(ctx + b, model.new_cache(C + B))[C:]
    assert _rel(tree[:A], sep_a) < 1e-4
    assert _rel(tree[A:], sep_b) < 1e-4
    # and the tree forward differs from an unmasked one (the mask really hides the other branch)
    plain = model.forward(ctx + a + b, model.new_cache(C + A + B))[C + A:]
    assert _rel(plain, sep_b) > 1e-3


@pytest.mark.parametrize("name", _names())
def test_tree_mask(name):
    model = _model(name)
    case = _ref(name)["cases"][1]
    ctx = case["prompt_ids"][:8]
    g = case["greedy_ids"]
    _tree_check(model, ctx, g[:3], g[3:7])
    hp = model.hp
    if getattr(hp, "n_swa", 0) and name == "gemma3":
        old = hp.n_swa
        hp.n_swa = 3  # the local layers now see only 3 positions back: window on positions matters
        try:
            _tree_check(model, ctx, g[:3], g[3:7])
        finally:
            hp.n_swa = old


def test_bad_forward_args():
    """Bad forward() input raises categorized errors and leaves the cache as it was (qwen3 fixture)."""
    from reflex.errors import ContextOverflow, InvalidRequest

    model = _model("qwen3")
    cache = model.new_cache(6)
    model.forward([1, 2], cache)
    for kw in (dict(token_ids=[]), dict(token_ids=[10 ** 9]), dict(token_ids=[1], output="x"),
               dict(token_ids=[1, 2], positions=[0]), dict(token_ids=[1], attn_mask=np.ones((1, 2), bool))):
        with pytest.raises(InvalidRequest):
            model.forward(cache=cache, **kw)
        assert cache.n == 2
    with pytest.raises(ContextOverflow):
        model.forward([1] * 5, cache)
    assert cache.n == 2


def test_hparams_errors():
    from reflex.errors import ModelFormatError
    from reflex.gguf import GGUFFile
    from reflex.models import gemma3, qwen3

    class Fake:
        def __init__(self, f, **over):
            self.metadata = dict(f.metadata, **over)
            self.tensors = f.tensors

        def get(self, k, default=None):
            return self.metadata.get(k, default)

    with GGUFFile(CASES["qwen3"][0]) as f:
        hp = qwen3.HParams.from_gguf(f, "qwen3")
        assert (hp.head_dim, hp.n_head, hp.n_head_kv, hp.n_rot) == (128, 2, 1, 128)
        for over, what in (({"qwen3.attention.key_length": 7, "qwen3.attention.value_length": 7},
                            r"attention\.key_length"),
                           ({"qwen3.attention.head_count_kv": 3}, r"attention\.head_count_kv"),
                           ({"qwen3.attention.value_length": 64}, r"value_length"),
                           ({"qwen3.rope.freq_base": -1.0}, r"rope\.freq_base")):
            with pytest.raises(ModelFormatError, match=what):
                qwen3.HParams.from_gguf(Fake(f, **over), "qwen3")
        with pytest.raises(ModelFormatError, match=r"missing hyperparameter .gemma3"):
            gemma3.HParams.from_gguf(Fake(f), "gemma3")  # no gemma3.* keys at all
