"""reflex synth: random weights with a real model's shapes, metadata and tokenizer (SmolLM2-135M Q4_1)."""
import os

import numpy as np
import pytest

MODELS = os.environ.get("REFLEX_MODELS", os.path.expanduser("~/.cache/reflex/models"))
MODEL = os.path.join(MODELS, "SmolLM2-135M-Instruct.Q4_1.gguf")

pytestmark = pytest.mark.skipif(not os.path.exists(MODEL), reason=f"model not found: {MODEL}")


def _synth(out, **kw):
    from reflex.synth import synthesize

    return synthesize(MODEL, str(out), **kw)


def _meta_equal(a, b):
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.array_equal(np.asarray(a), np.asarray(b))
    if hasattr(a, "tolist") and hasattr(b, "tolist"):
        return list(a.tolist()) == list(b.tolist())
    return a == b


@pytest.fixture(scope="module")
def synth2(tmp_path_factory):
    out = tmp_path_factory.mktemp("synth") / "s2.gguf"
    res = _synth(out, seed=0, layers=2)
    return out, res


def test_metadata_and_tensors(synth2):
    from reflex.gguf import GGUFFile

    out, res = synth2
    with GGUFFile(MODEL) as real, GGUFFile(out) as syn:
        bc = f"{real.arch}.block_count"
        assert int(syn.metadata[bc]) == 2 and res["block_count"] == 2
        assert set(real.metadata) == set(syn.metadata)
        for k, v in real.metadata.items():
            if k in (bc, "general.alignment"):
                continue
            assert _meta_equal(v, syn.metadata[k]), k
        kept = [n for n in real.tensors if not n.startswith("blk.") or int(n.split(".")[1]) < 2]
        assert list(syn.tensors) == kept
        for n in kept:
            r, s = real.tensors[n], syn.tensors[n]
            assert tuple(s.shape) == tuple(r.shape), n
            assert s.ggml_type == (r.ggml_type if len(r.shape) > 1 else 0), n
            assert not np.array_equal(real.tensor_bytes(n), syn.tensor_bytes(n)), n


def test_weight_statistics(synth2):
    from reflex.gguf import GGUFFile
    from reflex.quants import dequantize
    from reflex.synth import STD

    out, _ = synth2
    with GGUFFile(out) as syn:
        for n in ("blk.0.attn_q.weight", "blk.1.ffn_down.weight", "token_embd.weight"):
            ti = syn.tensors[n]
            x = dequantize(syn.tensor_bytes(n), ti.ggml_type, ti.shape)
            assert abs(float(x.std()) - STD) < 0.2 * STD, (n, x.std())
            assert abs(float(x.mean())) < 0.1 * STD
        ti = syn.tensors["blk.0.attn_norm.weight"]
        x = dequantize(syn.tensor_bytes("blk.0.attn_norm.weight"), ti.ggml_type, ti.shape)
        assert abs(float(x.mean()) - 1.0) < 0.01 and abs(float(x.std()) - STD) < 0.2 * STD


def test_seed_determinism(synth2, tmp_path):
    out, _ = synth2
    same, other = tmp_path / "same.gguf", tmp_path / "other.gguf"
    _synth(same, seed=0, layers=2)
    _synth(other, seed=1, layers=2)
    a, b, c = (open(p, "rb").read() for p in (out, same, other))
    assert a == b
    assert len(a) == len(c) and a != c


def test_vocab_only_tokenizer(tmp_path):
    from reflex.gguf import GGUFFile
    from reflex.tokenizer import Tokenizer

    out = tmp_path / "vocab.gguf"
    res = _synth(out, vocab_only=True)
    assert res["tensors"] == {}
    assert os.path.getsize(out) < 4 << 20
    with GGUFFile(out) as v, GGUFFile(MODEL) as real:
        assert len(v.tensors) == 0
        ids = Tokenizer.from_gguf(v).encode("hello world")
        assert ids == Tokenizer.from_gguf(real).encode("hello world") and len(ids) > 0


def test_forced_type_and_fallback(tmp_path, capsys):
    from reflex.gguf import GGUFFile
    from reflex.quants import QUANTS
    from reflex.synth import type_by_name

    out = tmp_path / "q3.gguf"
    res = _synth(out, layers=1, type_name="Q3_K")  # not writable -> Q4_K (or a block-size fallback)
    assert res["fallbacks"] > 0 and "Q3_K" in capsys.readouterr().err
    q4k = type_by_name("Q4_K")
    with GGUFFile(out) as syn:
        for n, ti in syn.tensors.items():
            if len(ti.shape) == 1:
                assert ti.ggml_type == 0
            elif ti.shape[-1] % QUANTS[q4k].block_size == 0:
                assert ti.ggml_type == q4k, n


def test_synth_model_runs(synth2):
    from reflex.models import load_model

    out, _ = synth2
    model = load_model(str(out), "numpy")
    logits = model.forward([1, 2, 3, 4], model.new_cache(8))
    assert logits.shape[0] == 4 and np.all(np.isfinite(logits))


def test_cli(tmp_path):
    import subprocess
    import sys

    out = tmp_path / "cli.gguf"
    r = subprocess.run([sys.executable, "-m", "reflex", "synth", MODEL, str(out), "--vocab-only", "--json"],
                       capture_output=True, text=True, cwd=os.path.dirname(os.path.dirname(__file__)))
    assert r.returncode == 0, r.stderr
    import json

    assert json.loads(r.stdout)["output"] == str(out)
