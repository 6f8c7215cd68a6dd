"""qwen35 specifics (Gated DeltaNet + gated full attention), on the committed fixture and its
transformers recording (tests/data/qwen35_ref_models.json, written by scripts/make_model_refs.py;
CI reads the recording only). The shared runner (test_models_parity.py) does parity, prefill ==
decode and the snapshot fork check; here: hyperparameter errors, input errors, and that the
structural features the fixture exercises really matter (each variant must break reference parity).
"""
import json
import os

import numpy as np
import pytest

from reflex.errors import InvalidRequest, ModelFormatError

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURE = os.path.join(HERE, "data", "fixtures", "qwen35.gguf")
REF = os.path.join(HERE, "data", "qwen35_ref_models.json")


class _Fake:
    def __init__(self, f, drop=(), **over):
        self.metadata = {k: v for k, v in dict(f.metadata, **over).items() if k not in drop}
        self.tensors = f.tensors
        self.tensor_bytes = f.tensor_bytes

    def get(self, k, default=None):
        return self.metadata.get(k, default)


@pytest.fixture(scope="module")
def model():
    from reflex.models import load_model

    return load_model(FIXTURE, "numpy")


def _ref_err(model, case):
    """Relative error of the prompt logits against the recorded top-20 values (as the runner)."""
    d = case["logits"]
    lg = model.forward(case["prompt_ids"], model.new_cache(len(case["prompt_ids"])))
    err = max(np.max(np.abs(lg[r, d["top_ids"][j]] - np.array(d["top_values"][j])))
              for j, r in enumerate(d["rows"]))
    return err / max(d["max_abs"])


def _case(i=1):
    with open(REF) as fh:
        return json.load(fh)["cases"][i]


def test_hparams(model):
    hp = model.hp
    assert hp.recurrent == (True, False, True, False)
    assert (hp.n_rot, hp.head_dim, hp.rope_sections) == (8, 32, (2, 1, 1, 0))
    assert (hp.d_conv, hp.d_state, hp.n_k_head, hp.n_v_head, hp.d_inner) == (4, 16, 2, 4, 64)


def test_hparams_errors():
    from reflex.gguf import GGUFFile
    from reflex.models import qwen35

    with GGUFFile(FIXTURE) as f:
        for over, what in (({"qwen35.rope.dimension_sections": np.array([2, 2, 1, 0])}, r"dimension_sections"),
                           ({"qwen35.attention.recurrent_layers": np.array([True, False])}, r"recurrent_layers"),
                           ({"qwen35.ssm.group_count": 3}, r"ssm\.group_count"),
                           ({"qwen35.ssm.inner_size": 48}, r"ssm\.inner_size"),
                           ({"qwen35.rope.dimension_count": 40}, r"rope\.dimension_count"),
                           ({"qwen35.attention.value_length": 16}, r"value_length")):
            with pytest.raises(ModelFormatError, match=what):
                qwen35.HParams.from_gguf(_Fake(f, **over))
        with pytest.raises(ModelFormatError, match="dimension_sections"):
            qwen35.HParams.from_gguf(_Fake(f, drop=("qwen35.rope.dimension_sections",)))
        # without recurrent_layers the interval decides: every 2nd layer full attention = the fixture
        hp = qwen35.HParams.from_gguf(_Fake(f, drop=("qwen35.attention.recurrent_layers",),
                                            **{"qwen35.full_attention_interval": 2}))
        assert hp.recurrent == (True, False, True, False)
        # consistent keys that do not fit the tensors: a shape error at load, not an IndexError later
        from reflex.backends import get_backend

        with pytest.raises(ModelFormatError, match="shape"):
            qwen35.load(_Fake(f, **{"qwen35.ssm.state_size": 8, "qwen35.ssm.inner_size": 32}),
                        get_backend("numpy"))


def test_input_errors_leave_cache(model):
    cache = model.new_cache(16)
    model.forward([1, 2, 3], cache)
    snap = cache.snapshot()
    bad = np.ones((1, 4), dtype=bool)  # sees every slot, but a recurrence cannot hide or reveal
    bad[0, 1] = False
    with pytest.raises(InvalidRequest, match="attn_mask"):
        model.forward([4], cache, attn_mask=bad)
    with pytest.raises(InvalidRequest, match="truncate|snapshot"):
        cache.truncate(1)
    assert cache.n == 3
    # the failed calls changed nothing: the next token matches a cache restored from the snapshot
    a = model.forward([4], cache)
    cache.restore(snap)
    assert np.array_equal(model.forward([4], cache), a)
    # the plain causal mask is accepted and equals no mask
    cache.restore(snap)
    causal = np.ones((1, 4), dtype=bool)
    assert np.allclose(model.forward([4], cache, attn_mask=causal), a)
    cache.truncate(0)
    assert cache.n == 0
    assert np.allclose(model.forward([1, 2, 3, 4], cache)[-1:], a, rtol=0, atol=1e-4 * np.abs(a).max())


def test_features_matter(model, monkeypatch):
    """The fixture exercises the tiled V-head order, the attention output gate and the delta-rule
    decay: each wrong variant must break parity with transformers."""
    case = _case(1)
    assert _ref_err(model, case) < 1e-3
    b = model.backend
    rule = type(b).gated_delta_rule

    def grouped(self, qkv, alpha, beta, ssm_a, dt_bias, state, n_k_head, eps):
        # key head h // r for value head h (HF's grouped order) instead of the GGUF's tiled h % n_k
        n_v, d_k, _ = state.shape
        kd = n_k_head * d_k
        q = qkv[:, :kd].reshape(len(qkv), n_k_head, d_k)
        k = qkv[:, kd:2 * kd].reshape(len(qkv), n_k_head, d_k)
        order = np.arange(n_v) // (n_v // n_k_head)                # (n_v_head,) grouped k head per v head
        # with n_k_head = n_v the op's tiled map is the identity, so head h reads k head order[h]
        qkv2 = np.concatenate([q[:, order].reshape(len(qkv), -1), k[:, order].reshape(len(qkv), -1),
                               qkv[:, 2 * kd:]], 1)
        return rule(self, qkv2, alpha, beta, ssm_a, dt_bias, state, n_v, eps)

    monkeypatch.setattr(type(b), "gated_delta_rule", grouped)
    assert _ref_err(model, case) > 1e-2
    monkeypatch.setattr(type(b), "gated_delta_rule", rule)

    for blk in model.blocks:
        if not blk.recurrent:
            monkeypatch.setattr(blk.mixer, "wq", blk.mixer.wg)
            monkeypatch.setattr(blk.mixer, "wg", blk.mixer.wq)
    assert _ref_err(model, case) > 1e-2
    monkeypatch.undo()

    for blk in model.blocks:
        if blk.recurrent:
            monkeypatch.setattr(blk.mixer, "ssm_a", np.zeros_like(blk.mixer.ssm_a))  # no decay
    assert _ref_err(model, case) > 1e-2
    monkeypatch.undo()
    assert _ref_err(model, case) < 1e-3


def test_gated_delta_rule_direct():
    """The NumPy op against a per-head scalar loop written from the formula (state carried across
    two calls equals one call over the whole sequence)."""
    from reflex.backends import get_backend

    b = get_backend("numpy")
    rng = np.random.default_rng(0)
    T, nk, nv, dk, dv = 5, 2, 4, 3, 3
    qkv = rng.standard_normal((T, 2 * nk * dk + nv * dv)).astype(np.float32)
    alpha, beta = rng.standard_normal((2, T, nv)).astype(np.float32)
    A = -np.exp(rng.standard_normal(nv)).astype(np.float32)
    dtb = rng.standard_normal(nv).astype(np.float32)
    st = b.ssm_state((nv, dk, dv))
    out = np.concatenate([b.gated_delta_rule(qkv[:2], alpha[:2], beta[:2], A, dtb, st, nk, 1e-6),
                          b.gated_delta_rule(qkv[2:], alpha[2:], beta[2:], A, dtb, st, nk, 1e-6)])
    ref = np.zeros((T, nv, dv))
    for h in range(nv):
        S = np.zeros((dk, dv))
        for t in range(T):
            q = qkv[t, (h % nk) * dk:(h % nk + 1) * dk].astype(np.float64)
            k = qkv[t, nk * dk + (h % nk) * dk:nk * dk + (h % nk + 1) * dk].astype(np.float64)
            v = qkv[t, 2 * nk * dk + h * dv:2 * nk * dk + (h + 1) * dv].astype(np.float64)
            q = q / np.sqrt(q @ q + 1e-6) / np.sqrt(dk)
            k = k / np.sqrt(k @ k + 1e-6)
            g = A[h] * np.log1p(np.exp(alpha[t, h] + dtb[h]))
            bt = 1 / (1 + np.exp(-beta[t, h]))
            S = np.exp(g) * S
            S = S + np.outer(k, bt * (v - k @ S))
            ref[t, h] = q @ S
        assert np.allclose(st[h], S, atol=1e-5)
    assert np.allclose(out, ref, atol=1e-5)
