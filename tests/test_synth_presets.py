"""Synthetic benchmark presets qwen3moe-30b-a3b-small and minilm-l6 (reflex.synth.PRESETS).

Independent references: the layout (names, shapes, keys) is checked against files other tools wrote
(tests/data/fixtures/qwen3moe.gguf, written by llama.cpp's converter; the real all-MiniLM-L6-v2 GGUF
where ~/.cache/reflex/models has it, else skipped); the numbers against llama-cpp-python run live on
the same synthetic file (skipped where llama_cpp is not installed, as in CI). The tokenizer sources
are committed: the qwen3moe fixture (gpt2 BPE) and tests/data/bert_cls_tiny_lcpp.gguf (WordPiece).
"""
import os
import subprocess
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MOE_FIXTURE = os.path.join(HERE, "data", "fixtures", "qwen3moe.gguf")
BERT_VOCAB = os.path.join(HERE, "data", "bert_cls_tiny_lcpp.gguf")
MODELS = os.environ.get("REFLEX_MODELS", os.path.expanduser("~/.cache/reflex/models"))
MINILM = os.path.join(MODELS, "all-MiniLM-L6-v2.F32.gguf")
# every row a multiple of 256 (Q4_K / Q6_K), so llama.cpp takes the file as it is
TINY_MOE = dict(embedding_length=256, expert_count=4, expert_used_count=2, expert_feed_forward_length=256,
                **{"attention.head_count": 2, "attention.head_count_kv": 1})


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    from reflex.synth import synthesize_preset

    out = str(tmp_path_factory.mktemp("moe") / "moe.gguf")
    res = synthesize_preset(MOE_FIXTURE, out, "qwen3moe-30b-a3b-small", layers=2, overrides=TINY_MOE)
    return out, res


@pytest.fixture(scope="module")
def minilm(tmp_path_factory):
    from reflex.synth import synthesize_preset

    out = str(tmp_path_factory.mktemp("minilm") / "minilm.gguf")
    res = synthesize_preset(BERT_VOCAB, out, "minilm-l6")
    return out, res


def _pattern(name):
    return name.split(".", 2)[-1] if name.startswith("blk.") else name


def test_moe_layout_matches_converter(moe):
    """Same tensor names, ranks and type classes as llama.cpp's converter writes for qwen3moe, and every
    qwen3moe.* key the converter wrote."""
    from reflex.gguf import GGUFFile

    out, res = moe
    assert res["block_count"] == 2 and res["arch"] == "qwen3moe"
    with GGUFFile(MOE_FIXTURE) as ref, GGUFFile(out) as syn:
        assert syn.arch == "qwen3moe"
        assert set(syn.tensors) == set(ref.tensors)
        for n, ti in syn.tensors.items():
            assert len(ti.shape) == len(ref.tensors[n].shape), n
            assert (ti.ggml_type == 0) == (len(ti.shape) == 1 or "ffn_gate_inp" in n), n
        ref_keys = {k for k in ref.metadata if k.startswith("qwen3moe.")}
        assert ref_keys <= set(syn.metadata), ref_keys - set(syn.metadata)
        assert "qwen3moe.expert_weights_norm" not in syn.metadata  # the converter writes none either
        m = syn.metadata
        assert (m["qwen3moe.expert_count"], m["qwen3moe.expert_used_count"]) == (4, 2)
        assert m["qwen3moe.expert_feed_forward_length"] == 256 and m["qwen3moe.attention.key_length"] == 128
        # the vocab source's own name / file type (a converter's F16 file) are not carried over
        assert m["general.name"] == "qwen3moe-30b-a3b-small" and m["general.file_type"] == 15  # Q4_K_M
        t = syn.tensors
        assert tuple(t["blk.1.ffn_gate_exps.weight"].shape) == (4, 256, 256)
        assert tuple(t["blk.1.ffn_down_exps.weight"].shape) == (4, 256, 256)
        assert tuple(t["blk.0.ffn_gate_inp.weight"].shape) == (4, 256)
        assert tuple(t["blk.0.attn_q.weight"].shape) == (256, 256)  # 2 heads of 128
        assert tuple(t["output.weight"].shape) == tuple(t["token_embd.weight"].shape) == (49152, 256)


def test_moe_full_shape():
    """The preset itself: 30B-A3B's per-layer shapes; 4 layers in a Q4_K_M-like mix come to 1-2 GB."""
    from reflex.quants import QUANTS
    from reflex.synth import PRESETS, preset_tensors, type_by_name

    pr = PRESETS["qwen3moe-30b-a3b-small"]
    ts = {n: (s, t) for n, s, t in preset_tensors(pr["arch"], pr["hp"], 49152, pr["types"])}
    assert ts["blk.0.ffn_up_exps.weight"] == ((128, 768, 2048), "Q4_K")
    assert ts["blk.0.ffn_down_exps.weight"][0] == (128, 2048, 768)
    assert ts["blk.0.attn_q.weight"][0] == (4096, 2048) and ts["blk.0.attn_k.weight"][0] == (512, 2048)
    assert ts["blk.0.ffn_gate_inp.weight"] == ((128, 2048), "F32")
    assert ts["output.weight"][1] == "Q6_K" and ts["token_embd.weight"][1] == "Q4_K"
    per_layer = sum(int(np.prod(s)) for n, (s, _) in ts.items() if n.startswith("blk.0."))
    assert 6.0e8 < per_layer < 6.5e8
    size = 0
    for n, (s, t) in ts.items():
        q = QUANTS[type_by_name(t)]
        size += int(np.prod(s)) // q.block_size * q.type_size
    assert 1.0e9 < size < 2.0e9, size


def test_moe_runs_in_reflex(moe):
    from reflex.models import load_model

    model = load_model(moe[0], "numpy")
    logits = np.asarray(model.forward([1, 2, 3, 4], model.new_cache(8)))
    assert logits.shape == (4, 49152) and np.all(np.isfinite(logits)) and logits.std() > 0


def test_moe_matches_llama_cpp(moe):
    """llama.cpp loads the synthetic file, generates, and its logits track reflex's (its CPU path
    quantizes activations to Q8_K, hence a correlation, not equality). Skips without llama_cpp."""
    llama_cpp = pytest.importorskip("llama_cpp")
    from reflex.models import load_model

    toks = [1, 2, 3, 400, 5000]
    m = load_model(moe[0], "numpy")
    ours = np.asarray(m.forward(toks, m.new_cache(8)))
    llm = llama_cpp.Llama(moe[0], n_ctx=64, logits_all=True, verbose=False)
    llm.eval(toks)
    theirs = np.asarray(llm.scores[:len(toks)])
    for i in range(len(toks)):
        assert np.corrcoef(ours[i], theirs[i])[0, 1] > 0.999, i
    llm.reset()
    out = llm("Hello", max_tokens=3)
    assert out["usage"]["completion_tokens"] >= 1


def test_minilm_layout(minilm):
    """MiniLM-L6's shapes and reflex convert's names / keys; against the real converted file if present."""
    from reflex.gguf import GGUFFile

    out, res = minilm
    assert res["tensors"] == {"F32": 101}
    with GGUFFile(out) as syn:
        m = syn.metadata
        assert syn.arch == "bert" and m["bert.embedding_length"] == 384 and m["bert.block_count"] == 6
        assert m["bert.attention.head_count"] == 12 and m["bert.feed_forward_length"] == 1536
        assert m["bert.pooling_type"] == 1 and m["bert.attention.causal"] is False
        assert m["general.file_type"] == 0 and m["general.name"] == "minilm-l6"  # ALL_F32
        assert syn.metadata_types["bert.attention.causal"] == 7  # BOOL, as the converter writes it
        assert tuple(syn.tensors["position_embd.weight"].shape) == (512, 384)
        assert tuple(syn.tensors["token_types.weight"].shape) == (2, 384)
        if os.path.exists(MINILM):
            with GGUFFile(MINILM) as real:
                assert {n: tuple(t.shape) for n, t in syn.tensors.items()} == \
                       {n: tuple(t.shape) for n, t in real.tensors.items()}
                for k, v in real.metadata.items():
                    if k.startswith("bert."):
                        assert syn.metadata[k] == v and syn.metadata_types[k] == real.metadata_types[k], k


def test_minilm_embeds_like_llama_cpp(minilm):
    """reflex embeds the synthetic MiniLM; llama.cpp (embedding=True) gives the same direction.
    The llama.cpp half skips without llama_cpp."""
    from reflex.engine import Engine

    texts = ["the quick brown fox jumps over the lazy dog", "a second, different sentence"]
    ours = np.asarray(Engine(minilm[0], backend="numpy").embed(texts))
    assert ours.shape == (2, 384) and np.all(np.isfinite(ours))
    assert abs(float(ours[0] @ ours[1])) < 0.99  # two texts, two embeddings
    llama_cpp = pytest.importorskip("llama_cpp")
    llm = llama_cpp.Llama(minilm[0], embedding=True, verbose=False)
    for i, t in enumerate(texts):
        e = np.asarray(llm.embed(t))
        cos = float(ours[i] @ e) / (np.linalg.norm(ours[i]) * np.linalg.norm(e))
        assert cos > 0.9999, (i, cos)


def test_forced_type_keeps_f32_tables(tmp_path):
    from reflex.gguf import GGUFFile
    from reflex.synth import synthesize_preset, type_by_name

    out = str(tmp_path / "q8.gguf")
    synthesize_preset(BERT_VOCAB, out, "minilm-l6", layers=1, type_name="Q8_0")
    q8 = type_by_name("Q8_0")
    with GGUFFile(out) as syn:
        assert "general.file_type" not in syn.metadata  # the preset's mix no longer describes the file
        for n, ti in syn.tensors.items():
            want = q8 if n.endswith(".weight") and len(ti.shape) == 2 and n not in (
                "position_embd.weight", "token_types.weight") else 0
            assert ti.ggml_type == want, n


def test_workers_same_bytes(tmp_path):
    from reflex.synth import synthesize_preset

    a, b = str(tmp_path / "a.gguf"), str(tmp_path / "b.gguf")
    ra = synthesize_preset(MOE_FIXTURE, a, "qwen3moe-30b-a3b-small", layers=1, overrides=TINY_MOE, workers=1)
    rb = synthesize_preset(MOE_FIXTURE, b, "qwen3moe-30b-a3b-small", layers=1, overrides=TINY_MOE, workers=2)
    assert (ra["workers"], rb["workers"]) == (1, 2)
    assert open(a, "rb").read() == open(b, "rb").read()


def test_cli_preset_and_errors(tmp_path):
    def cli(*a):
        return subprocess.run([sys.executable, "-m", "reflex", "synth", *a], capture_output=True, text=True,
                              cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT})

    out = str(tmp_path / "cli.gguf")
    r = cli(BERT_VOCAB, out, "--preset", "minilm-l6", "--layers", "1", "--workers", "1")
    assert r.returncode == 0, r.stderr
    assert os.path.getsize(out) > 30522 * 384 * 4
    for bad in (["--preset", "no-such-preset"], ["--preset", "minilm-l6", "--workers", "0"]):
        dst = str(tmp_path / "bad.gguf")
        r = cli(BERT_VOCAB, dst, *bad)
        assert r.returncode != 0 and not os.path.exists(dst)
        assert "preset" in r.stderr or "workers" in r.stderr


@pytest.mark.skipif(not os.path.exists(MINILM), reason=f"model not found: {MINILM}")
def test_minilm_vocab_only_size(tmp_path):
    """The vocab-only MiniLM the device run carries (.devdata/minilm-vocab.gguf) stays under 2 MB."""
    from reflex.gguf import GGUFFile
    from reflex.synth import synthesize

    out = tmp_path / "minilm-vocab.gguf"
    synthesize(MINILM, str(out), vocab_only=True)
    assert os.path.getsize(out) < 2 << 20
    with GGUFFile(out) as v:
        assert len(v.tensors) == 0 and len(v.metadata["tokenizer.ggml.tokens"]) == 30522
