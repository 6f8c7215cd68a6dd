"""deepseek2-specific checks beyond the shared parity runner (tests/test_models_parity.py).

- hyperparameter errors are categorized (ModelFormatError kind invalid_key, UnsupportedArchitecture
  for group-limited routing and non-YaRN rope scaling);
- each DeepSeek feature the fixture carries must matter: dropping exp_probs_b, switching sigmoid
  scoring to softmax, YaRN to plain RoPE, or the routed scale must break agreement with the recorded
  transformers logits (tests/data/deepseek2_ref_models.json, recorded by scripts/make_model_refs.py;
  no torch in CI);
- the cache holds only the latent (kv_lora_rank + n_rot per position per layer);
- mla_attention (absorbed form, NumPy backend) against a direct decompressed multi-head attention
  written here (K = [c k_b ; k_pe], V = c v_b^T per head).
"""
import dataclasses
import json
import os

import numpy as np
import pytest

from reflex.errors import ModelFormatError, UnsupportedArchitecture

DATA = os.path.join(os.path.dirname(__file__), "data")
FIXTURE = os.path.join(DATA, "fixtures", "deepseek2.gguf")
REF = os.path.join(DATA, "deepseek2_ref_models.json")


class _Override:
    """A GGUF file whose metadata get() answers `over` first (None = key absent)."""

    def __init__(self, f, over):
        self.f, self.over = f, over
        self.metadata = f.metadata
        self.tensors = f.tensors

    def get(self, key, default=None):
        if key in self.over:
            v = self.over[key]
            return default if v is None else v
        return self.f.get(key, default)

    def tensor_bytes(self, name):
        return self.f.tensor_bytes(name)


def _file(over=None):
    from reflex.gguf import GGUFFile

    f = GGUFFile(FIXTURE)
    return _Override(f, over or {})


def _hp(over):
    from reflex.models.deepseek2 import HParams

    return HParams.from_gguf(_file(over), "deepseek2")


@pytest.mark.parametrize("over", [
    {"deepseek2.attention.key_length": 17},                  # not kv_lora_rank + n_rot
    {"deepseek2.attention.value_length": 9},
    {"deepseek2.attention.key_length_mla": 8},               # no nope part (== n_rot)
    {"deepseek2.rope.dimension_count": 7},
    {"deepseek2.expert_gating_func": 3},
    {"deepseek2.leading_dense_block_count": 5},
    {"deepseek2.expert_used_count": 5},
    {"deepseek2.attention.kv_lora_rank": 0},
    {"deepseek2.rope.scaling.original_context_length": 0},
    {"deepseek2.expert_group_count": 3},                     # does not divide expert_count 4
    {"deepseek2.expert_group_count": 2, "deepseek2.expert_group_used_count": 3},
])
def test_bad_hparams(over):
    with pytest.raises(ModelFormatError) as e:
        _hp(over)
    assert e.value.kind == "invalid_key"


@pytest.mark.parametrize("over", [
    # group-limited routing with softmax scoring (V2's group_limited_greedy)
    {"deepseek2.expert_gating_func": 1, "deepseek2.expert_group_count": 2, "deepseek2.expert_group_used_count": 1},
    {"deepseek2.rope.scaling.type": "linear"},
])
def test_unsupported(over):
    with pytest.raises(UnsupportedArchitecture):
        _hp(over)


def test_missing_tensor_is_format_error():
    from reflex.backends import get_backend
    from reflex.models.deepseek2 import Model

    f = _file()
    hp = _hp({})
    tensors = dict(f.tensors)
    del tensors["blk.1.attn_k_b.weight"]
    f.tensors = tensors
    with pytest.raises(ModelFormatError) as e:
        Model(f, get_backend("numpy"), hp)
    assert e.value.kind == "missing_tensor"


def _ref_err(model, case, ref):
    """max |ours - recorded| over the recorded top / probe logits, relative to the largest |logit|."""
    d = case["logits"]
    b = model.backend
    ids = case["prompt_ids"]
    h = model.forward(ids, model.new_cache(len(ids)), output="hidden")
    ours = b.to_numpy(b.matmul(h[d["rows"]], model.output))
    probe = np.array(ref.get("probe_ids", []), dtype=np.int64)
    err = 0.0
    for r in range(len(d["rows"])):
        err = max(err, np.max(np.abs(ours[r, d["top_ids"][r]] - np.array(d["top_values"][r]))))
        if len(probe) and d["probe_values"][r]:
            err = max(err, np.max(np.abs(ours[r, probe] - np.array(d["probe_values"][r]))))
    return err / max(d["max_abs"])


def _variant(**hp_changes):
    from reflex.backends import get_backend
    from reflex.models.deepseek2 import Model

    hp = dataclasses.replace(_hp({}), **hp_changes) if hp_changes else _hp({})
    return Model(_file(), get_backend("numpy"), hp)


def _no_bias():
    m = _variant()
    for blk in m.blocks:
        if hasattr(blk.ffn, "bias"):
            assert blk.ffn.bias is not None  # the fixture has exp_probs_b on every MoE layer
            blk.ffn.bias = None
    return m


@pytest.mark.parametrize("make", [
    lambda: _variant(),                                         # baseline: must match
    _no_bias,                                                   # exp_probs_b ignored
    lambda: _variant(gating_func=1),                            # softmax instead of sigmoid
    lambda: _variant(yarn=False),                               # plain RoPE, no mscale
    lambda: _variant(expert_weights_scale=1.0),                 # routed_scaling_factor dropped
    lambda: _variant(expert_weights_norm=False),
], ids=["baseline", "no_exp_probs_b", "softmax", "no_yarn", "no_scale", "no_norm"])
def test_features_matter(make):
    with open(REF) as fh:
        ref = json.load(fh)
    model = make()
    errs = [_ref_err(model, c, ref) for c in ref["cases"][:2]]
    if model.hp == _hp({}) and all(getattr(b.ffn, "bias", 0) is not None for b in model.blocks):
        assert max(errs) < 1e-3, errs
    else:
        assert max(errs) > 1e-2, f"changing the feature left the logits at the reference: {errs}"


def test_cache_is_latent():
    m = _variant()
    hp = m.hp
    cache = m.new_cache(32)
    assert len(cache.k) == hp.n_layer
    for c, pe in zip(cache.c, cache.pe):
        assert tuple(c.shape) == (32, 1, hp.kv_lora_rank)
        assert tuple(pe.shape) == (32, 1, hp.n_rot)
    m.forward([1, 2, 3], cache)
    assert cache.n == 3 and np.abs(np.asarray(cache.c[0][:3])).sum() > 0


def _mla_direct(q_nope, q_pe, c, pe, k_b, v_b, n_past, scale, mask=None):
    """Decompressed MHA: K_h = [c k_b[h] ; pe], V_h = c v_b[h]^T, softmax over visible slots."""
    T, H, _ = q_nope.shape
    S = n_past + T
    out = np.zeros((T, H, v_b.shape[1]))
    for h in range(H):
        K = np.concatenate([c[:S] @ k_b[h].astype(np.float64), pe[:S]], axis=1)   # (S, nope + P)
        V = c[:S] @ v_b[h].T.astype(np.float64)                                   # (S, v_head)
        q = np.concatenate([q_nope[:, h], q_pe[:, h]], axis=1)                    # (T, nope + P)
        s = q @ K.T * scale                                                       # (T, S)
        vis = mask if mask is not None else np.arange(S)[None, :] <= (n_past + np.arange(T))[:, None]
        s = np.where(vis, s, -np.inf)
        p = np.exp(s - s.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        out[:, h] = p @ V
    return out


@pytest.mark.parametrize("with_mask", [False, True])
def test_mla_attention_vs_decompressed(with_mask):
    from reflex.backends import get_backend

    b = get_backend("numpy")
    rng = np.random.default_rng(0)
    T, H, R, P, N, V, n_past, n_ctx = 5, 3, 10, 8, 6, 5, 4, 16
    S = n_past + T
    f32 = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    q_nope, q_pe = f32(T, H, N), f32(T, H, P)
    c_cache, pe_cache = f32(n_ctx, 1, R), f32(n_ctx, 1, P)
    k_b, v_b = f32(H, R, N), f32(H, V, R)
    mask = rng.random((T, S)) < 0.6 if with_mask else None
    if mask is not None:
        mask[:, 0] = True  # every query sees something
    heads = np.broadcast_to(np.arange(H), (T, H))
    q_lat = b.expert_matmul(q_nope, k_b, heads)                             # (T, H, R)
    o = b.mla_attention(q_lat, q_pe, c_cache, pe_cache, n_past, 0.3, mask=mask)
    got = b.expert_matmul(o, v_b, heads)                                    # (T, H, V)
    want = _mla_direct(q_nope.astype(np.float64), q_pe.astype(np.float64), c_cache[:, 0].astype(np.float64),
                       pe_cache[:, 0].astype(np.float64), k_b, v_b, n_past, 0.3, mask)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_rope_freqs_matches_rope():
    from reflex.backends import get_backend
    from reflex.backends.base import ROPE_NEOX, ROPE_NORM

    b = get_backend("numpy")
    x = np.random.default_rng(1).standard_normal((4, 2, 8)).astype(np.float32)
    pos = np.array([0, 3, 7, 100])
    inv = 10000.0 ** (-np.arange(0, 8, 2) / 8)
    for mode in (ROPE_NORM, ROPE_NEOX):
        np.testing.assert_allclose(b.rope_freqs(x, pos, inv, mode), b.rope(x, pos, 8, 10000.0, mode),
                                   rtol=1e-5, atol=1e-5)


GROUP = {"deepseek2.expert_group_count": 2, "deepseek2.expert_group_used_count": 1}


def _greedy(model, ids, n_new):
    cache = model.new_cache(len(ids) + n_new)
    lg = model.forward(ids, cache, last_only=True)
    out = []
    for _ in range(n_new):
        out.append(int(np.argmax(lg[-1])))
        lg = model.forward([out[-1]], cache)
    return out


def test_group_limited_routing():
    """The fixture read with expert_group_count 2 / expert_group_used_count 1 against transformers'
    DeepseekV3 with n_group 2 / topk_group 1 on the same weights (deepseek2_group_ref_models.json,
    recorded by scripts/make_model_refs.py deepseek2_group); the ungrouped model must not match it."""
    from reflex.backends import get_backend
    from reflex.models.deepseek2 import HParams, Model

    with open(os.path.join(DATA, "deepseek2_group_ref_models.json")) as fh:
        ref = json.load(fh)
    f = _file(GROUP)
    model = Model(f, get_backend("numpy"), HParams.from_gguf(f, "deepseek2"))
    assert (model.hp.n_group, model.hp.n_group_used) == (2, 1)
    for case in ref["cases"][:3]:
        assert _ref_err(model, case, ref) < 1e-3
        assert _greedy(model, case["prompt_ids"], len(case["greedy_ids"])) == case["greedy_ids"]
    plain = _variant()
    assert max(_ref_err(plain, c, ref) for c in ref["cases"][:3]) > 1e-2
