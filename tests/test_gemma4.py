"""What is specific to gemma4 (reflex/models/gemma4.py), beyond the shared parity runner.

- the proportional partial RoPE of global layers (q/k rows permuted at load, NEOX over 2k dims with
  base^(2k/d)) against a direct NumPy transcription of llama.cpp's freq-factor NEOX RoPE;
- features that must change the result: logit softcapping, layer_output_scale, the KV sharing of
  the last layers (each checked against the transformers outputs recorded by
  scripts/make_model_refs.py in tests/data/gemma4_ref_models.json: with the feature, parity; without
  it, a clear mismatch);
- hyperparameter and tensor errors (ModelFormatError with a kind).
No torch or transformers needed: only the committed fixture and recordings.
"""
import json
import os

import numpy as np
import pytest

from reflex.backends.base import ROPE_NEOX
from reflex.backends.numpy_backend import NumpyBackend
from reflex.errors import ModelFormatError
from reflex.gguf import GGUFFile
from reflex.models import gemma4, load_model

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURE = os.path.join(HERE, "data", "fixtures", "gemma4.gguf")
REF = os.path.join(HERE, "data", "gemma4_ref_models.json")


@pytest.fixture(scope="module")
def model():
    return load_model(FIXTURE, "numpy")


@pytest.fixture(scope="module")
def ref():
    with open(REF) as fh:
        return json.load(fh)


def _rel_err(model, case):
    """max deviation of the recorded top-20 logits, relative to the row's max |logit|."""
    lg = model.forward(case["prompt_ids"], model.new_cache(len(case["prompt_ids"])))  # (T, n_vocab)
    d = case["logits"]
    err = max(np.max(np.abs(lg[r, d["top_ids"][k]] - np.array(d["top_values"][k])))
              for k, r in enumerate(d["rows"]))
    return err / max(d["max_abs"])


def _direct_rope(x, pos, n_rot, base, ff):
    """llama.cpp's NEOX rope with freq factors: pair (i, i + n_rot/2), theta = pos * base^(-2i/n_rot) / ff[i]."""
    h = n_rot // 2
    i = np.arange(h, dtype=np.float64)
    th = np.asarray(pos, np.float64)[:, None] * (base ** (-2.0 * i / n_rot) / ff)[None, :]  # (T, h)
    c, s = np.cos(th)[:, None, :], np.sin(th)[:, None, :]
    x = x.astype(np.float64)
    out = x.copy()
    out[..., :h] = x[..., :h] * c - x[..., h:n_rot] * s
    out[..., h:n_rot] = x[..., :h] * s + x[..., h:n_rot] * c
    return out


def test_proportional_rope_equals_freq_factor_rope(model):
    hp = model.hp
    with GGUFFile(FIXTURE) as f:
        perm, n_rot, base = gemma4._rope_plan(f, hp)
        t = f.tensors["rope_freqs.weight"]
        from reflex.quants import dequantize
        ff = dequantize(f.tensor_bytes("rope_freqs.weight"), t.ggml_type, t.shape).reshape(-1).astype(np.float64)
    assert perm is not None and n_rot == 16 and hp.head_dim == 64  # partial 0.25: 8 of 32 pairs turn
    rng = np.random.default_rng(0)
    q = rng.standard_normal((5, 2, 64)).astype(np.float32)
    k = rng.standard_normal((5, 2, 64)).astype(np.float32)
    pos = np.array([0, 1, 7, 30, 1000])
    b = NumpyBackend()
    want_q = _direct_rope(q, pos, hp.n_rot, hp.rope_freq_base, ff)
    want_k = _direct_rope(k, pos, hp.n_rot, hp.rope_freq_base, ff)
    got_q = b.rope(q[..., perm], pos, n_rot, base, ROPE_NEOX)
    got_k = b.rope(k[..., perm], pos, n_rot, base, ROPE_NEOX)
    inv = np.argsort(perm)
    assert np.max(np.abs(got_q[..., inv] - want_q)) < 1e-5
    # what attention sees: q.k per (query, key, head), invariant under the shared permutation
    s_got = np.einsum("qhd,khd->hqk", got_q.astype(np.float64), got_k)
    s_want = np.einsum("qhd,khd->hqk", want_q, want_k)
    assert np.max(np.abs(s_got - s_want)) < 1e-4
    # and the plain NEOX over all 64 dims (ignoring the factors) is really different
    plain = b.rope(q, pos, hp.n_rot, hp.rope_freq_base, ROPE_NEOX)
    assert np.max(np.abs(plain - want_q)) > 0.1


def test_features_change_the_result(model, ref):
    case = ref["cases"][1]
    assert _rel_err(model, case) < 1e-3
    hp = model.hp
    old = hp.softcap
    try:
        hp.softcap = 0.0
        assert _rel_err(model, case) > 1e-2
    finally:
        hp.softcap = old
    blk = model.blocks[2]
    old = blk.out_scale
    try:
        blk.out_scale = 1.0
        assert _rel_err(model, case) > 1e-2
    finally:
        blk.out_scale = old
    # layer 5 (global, KV-shared) reads layer 3's cache; pointing it at layer 1 (same shape) must break it
    att = model.blocks[5].attn
    assert (att.src, att.own_kv, model.blocks[4].attn.src) == (3, False, 2)
    try:
        att.src = 1
        assert _rel_err(model, case) > 1e-2
    finally:
        att.src = 3
    assert _rel_err(model, case) < 1e-3


def test_cache_layout(model):
    c = model.new_cache(10)
    shapes = [None if k is None else k.shape for k in c.k]
    assert shapes == [(10, 1, 32), (10, 2, 64), (10, 1, 32), (10, 2, 64), None, None]
    assert [b.attn.n_rot for b in model.blocks] == [32, 16] * 3


class _Fake:
    def __init__(self, f, drop=(), **over):
        self.metadata = {k: v for k, v in dict(f.metadata, **over).items() if k not in drop}
        self.tensors = f.tensors

    def get(self, k, default=None):
        return self.metadata.get(k, default)


def test_hparams_errors():
    with GGUFFile(FIXTURE) as f:
        hp = gemma4.HParams.from_gguf(f)
        assert (hp.n_head_kv_arr, hp.n_ff_arr, hp.n_kv_shared, hp.n_embd_per_layer) == (
            [1, 2, 1, 2, 1, 2], [24, 24, 24, 24, 48, 48], 2, 2)
        assert (hp.head_dim, hp.head_dim_swa, hp.n_swa, hp.softcap) == (64, 32, 4, 3.0)
        bad = [
            (dict(drop=("gemma4.attention.sliding_window_pattern",)), "missing_key"),
            ({"gemma4.attention.sliding_window_pattern": [True, False]}, "invalid_key"),
            ({"gemma4.attention.head_count_kv": [1, 2, 1]}, "invalid_key"),
            ({"gemma4.attention.head_count_kv": [1, 3, 1, 2, 1, 2]}, "invalid_key"),
            ({"gemma4.attention.shared_kv_layers": 6}, "invalid_key"),
            # the shared layers' kind has no producer before them
            ({"gemma4.attention.shared_kv_layers": 5}, "invalid_key"),
            ({"gemma4.attention.key_length_swa": 31}, "invalid_key"),
            ({"gemma4.attention.value_length": 32}, "invalid_key"),
            ({"gemma4.rope.dimension_count": 66}, "invalid_key"),
            ({"gemma4.final_logit_softcapping": -1.0}, "invalid_key"),
            ({"gemma4.attention.sliding_window": 0}, "invalid_key"),
        ]
        for over, kind in bad:
            drop = over.pop("drop", ())
            with pytest.raises(ModelFormatError) as e:
                gemma4.HParams.from_gguf(_Fake(f, drop, **over))
            assert e.value.kind == kind, (over, drop, e.value)


def test_tensor_errors():
    with GGUFFile(FIXTURE) as f:
        hp = gemma4.HParams.from_gguf(f)

        b = NumpyBackend()
        # a layer with a MoE router in a file without expert_count is refused, not silently run dense
        fake = _Fake(f)
        fake.tensors = dict(f.tensors, **{"blk.0.ffn_gate_inp.weight": f.tensors["blk.0.ffn_norm.weight"]})
        fake.tensor_bytes = f.tensor_bytes
        with pytest.raises(ModelFormatError) as e:
            gemma4.Model(fake, b, hp)
        assert e.value.kind == "missing_key"
        # a missing per-layer tensor of a KV-owning layer
        fake.tensors = {k: v for k, v in f.tensors.items() if k != "blk.3.attn_k.weight"}
        with pytest.raises(ModelFormatError) as e:
            gemma4.Model(fake, b, hp)
        assert e.value.kind == "missing_tensor"


def test_moe_scales_matter():
    """gemma4moe fixture (dense MLP + 4 routed experts, top-2): parity with the recorded transformers
    outputs, lost when the per-expert scale or the router's input scale is ignored."""
    m = load_model(os.path.join(HERE, "data", "fixtures", "gemma4moe.gguf"), "numpy")
    with open(os.path.join(HERE, "data", "gemma4moe_ref_models.json")) as fh:
        case = json.load(fh)["cases"][1]
    assert m.graph_capturable is False and m.blocks[1].moe is not None
    assert m.blocks[1].attn.wv is not m.blocks[1].attn.wk  # v_proj present (k_eq_v false)
    assert _rel_err(m, case) < 1e-3
    moe = m.blocks[1].moe
    old = moe.expert_scale
    try:
        moe.expert_scale = np.ones_like(old)
        assert _rel_err(m, case) > 1e-2
    finally:
        moe.expert_scale = old
    old = moe.router_scale
    try:
        moe.router_scale = m.blocks[1].ffn_norm  # another (E,) vector: routing must change
        assert _rel_err(m, case) > 1e-2
    finally:
        moe.router_scale = old
