"""gemma4 (both fixtures: PLE / KV sharing / k == v, and MoE layers) on the CUDA backend.

gemma4 adds no backend op: it runs on the existing CUDA ops (rope over a partial width with permuted
q/k rows, weightless rms_norm, tanh for the softcap, embed on the per-layer table viewed as
(n_vocab * n_layer, n_pl) rows, expert_matmul on split gate/up experts). Reference: the transformers
outputs recorded by scripts/make_model_refs.py (KV caches are float16 on the GPU, so 1e-2 relative,
as tests/test_cuda_moe.py), prefill and one-token steps. Greedy tokens are left to the coordinator's
tests/test_cuda_models_parity.py (these random fixtures have top-1 margins down to ~3e-4, below
the float16 KV cache's error). Skipped cleanly where there is no CUDA GPU or the kernels are not built (CI has no GPU).
"""
import json
import os

import numpy as np
import pytest

from reflex.backends import cuda_driver

pytestmark = pytest.mark.skipif(
    not (os.path.exists(cuda_driver.default_fatbin()) and cuda_driver.available()),
    reason="no CUDA GPU or kernels not built")

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def gb():
    from reflex.backends.cuda_backend import CudaBackend
    return CudaBackend()


@pytest.mark.parametrize("name", ["gemma4", "gemma4moe"])
def test_gemma4_cuda_logits_and_decode(gb, name):
    from reflex.models import load_model
    with open(os.path.join(HERE, "data", f"{name}_ref_models.json")) as fh:
        ref = json.load(fh)
    model = load_model(os.path.join(HERE, "data", "fixtures", f"{name}.gguf"), gb)
    for case in ref["cases"][:3]:
        ids, d = case["prompt_ids"], case["logits"]
        ours = gb.to_numpy(model.forward(ids, model.new_cache(len(ids)), output="raw"))[d["rows"]]
        err = max(np.max(np.abs(ours[k, d["top_ids"][k]] - np.array(d["top_values"][k])))
                  for k in range(len(d["rows"])))
        assert err / max(d["max_abs"]) < 1e-2
        # one token at a time (the decode path, window on slots) agrees with the prefill
        cache = model.new_cache(len(ids))
        steps = np.concatenate([gb.to_numpy(model.forward([t], cache, output="raw")) for t in ids])[d["rows"]]
        assert np.max(np.abs(steps - ours)) / max(d["max_abs"]) < 1e-2
