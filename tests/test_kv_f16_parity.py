"""The GPU runner's checks (tests/test_cuda_models_parity.py) on the CPU: every case of the shared
runner (tests/test_models_parity.py CASES) on NumpyBackend(kv_f16=True), which stores K/V in float16
as the CUDA backend does, against the recorded transformers outputs (an independent implementation,
fp32; recorded by scripts/make_model_refs.py, so CI needs no transformers).

Same rule as on the GPU: prompt logits within LOGIT_REL (5e-3) of max|logit|, and the 32 greedy
tokens identical or a first divergence that is a near-tie within LOGIT_REL x max|logit|. A fixture
that fails here amplifies float16 KV rounding beyond the GPU tolerance (issue 8: gemma4's old
n_embd-8 fixture moved its logits by up to 0.28 of max|logit|), so CI guards every fixture's
conditioning without a GPU. Real models are skipped when not in $REFLEX_MODELS.
"""
import importlib.util
import os

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


def _load(name, file):
    spec = importlib.util.spec_from_file_location(name, os.path.join(HERE, file))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


runner = _load("_parity_runner_f16", "test_models_parity.py")
gpu = _load("_cuda_parity_rules", "test_cuda_models_parity.py")  # its rule and tolerance, not its GPU
LOGIT_REL = gpu.LOGIT_REL

_MODEL = {}


def _model(name):
    if name not in _MODEL:
        from reflex.backends.numpy_backend import NumpyBackend
        from reflex.models import load_model

        _MODEL.clear()  # one model in memory at a time
        _MODEL[name] = load_model(runner.CASES[name][0], NumpyBackend(kv_f16=True))
    return _MODEL[name]


# known to fail, with the measured reason; strict, so a fixed fixture turns them into failures to clean up
KNOWN = {
    # qwen3moe's fixture (n_embd 8, 8 experts top-2): prompt logits 5.7e-4, but greedy diverges at step
    # 16 by 9.0e-2 > 1.37e-2 (not a near-tie): the float16 cache flips a routing decision earlier on.
    # Its fixture needs the same reconditioning as gemma4's (issue 8), which this change does not touch.
    ("qwen3moe", 1): "qwen3moe fixture: float16 KV flips greedy at step 16 (gap 9e-2), issue 8",
}


def _params():
    out = []
    for p in runner._params():
        if p.values[1] < 0:
            continue  # a missing recording fails in the runner
        why = KNOWN.get(tuple(p.values))
        if why:
            p = pytest.param(*p.values, marks=list(p.marks) + [pytest.mark.xfail(reason=why, strict=True)], id=p.id)
        out.append(p)
    return out


@pytest.mark.parametrize("name,i", _params())
def test_kv_f16_reference_parity(name, i):
    ref = runner._ref(name)
    case = ref["cases"][i]
    model = _model(name)
    assert model.backend.kv_f16
    d = case["logits"]
    ours = runner._rows_logits(model, case["prompt_ids"], d["rows"])     # (R, n_vocab)
    rel = runner._recorded_rel_err(ref, case, ours)
    print(f"{name}-{i}: prompt logits rel err {rel:.2e} with a float16 KV cache")
    assert rel < LOGIT_REL, f"{name}: prompt logits rel err {rel:.2e} with a float16 KV cache"
    want = case["greedy_ids"]
    got = runner._greedy(model, case["prompt_ids"], len(want))
    gpu._check_greedy(model, name, "forward() kv_f16", case["prompt_ids"], want, got)
