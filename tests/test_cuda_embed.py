"""Embeddings on the CUDA backend vs the NumPy backend (issue 5: cosine >= 0.9999), same GGUF files.

Files: the llama.cpp-converted tiny fixtures in tests/data (bert with a classifier head, qwen3 with
LAST pooling, bidirectional llama-embed with MEAN pooling), and all-MiniLM-L6-v2 when present
($REFLEX_MINILM_GGUF, else the store's `minilm`). The NumPy backend's own correctness is proven
against sentence-transformers / transformers / llama.cpp in test_bert.py and test_embed.py.
Skipped cleanly where there is no CUDA GPU or the kernels are not built (CI has no GPU).
"""
import os

import numpy as np
import pytest

from reflex.backends import cuda_driver

pytestmark = pytest.mark.skipif(
    not (os.path.exists(cuda_driver.default_fatbin()) and cuda_driver.available()),
    reason="no CUDA GPU or kernels not built")

DATA = os.path.join(os.path.dirname(__file__), "data")
SENTS = ["The cat sat on the mat.", "Reflex answers one request and exits.",
         "FAISS builds an index of vectors for nearest-neighbour search over many chunks.",
         "A serverless GPU worker starts cold, answers, and exits; the time to the first result counts.",
         "Paris is the capital of France."]


def _models():
    out = [os.path.join(DATA, n) for n in ("bert_cls_tiny_lcpp.gguf", "qwen3_embed_tiny.gguf",
                                           "llama_embed_tiny.gguf")]
    mini = os.environ.get("REFLEX_MINILM_GGUF")
    if not mini:
        try:
            from reflex.store import resolve
            mini = str(resolve("minilm"))
        except Exception:
            mini = None
    if mini and os.path.exists(mini):
        out.append(mini)
    return out


@pytest.mark.parametrize("path", _models(), ids=os.path.basename)
def test_gpu_embeddings_match_cpu(path):
    from reflex.embed import classify_head, has_head
    from reflex.engine import Engine

    ec, eg = Engine(path, backend="numpy"), Engine(path, backend="cuda")
    if has_head(ec.model):  # RANK pooling: a classifier, compared by its label probabilities
        pc = [classify_head(ec, s) for s in SENTS]
        pg = [classify_head(eg, s) for s in SENTS]
        err = max(abs(a[k] - b[k]) for a, b in zip(pc, pg) for k in a)
        print(f"{os.path.basename(path)}: max |dprob| {err:.2e}")
        assert all(a.keys() == b.keys() for a, b in zip(pc, pg)) and err <= 1e-3
        return
    cpu = ec.embed(SENTS)    # (N, n_embd), unit rows
    gpu = eg.embed(SENTS)
    assert gpu.shape == cpu.shape and np.isfinite(gpu).all()
    cos = np.sum(cpu * gpu, axis=1) / (np.linalg.norm(cpu, axis=1) * np.linalg.norm(gpu, axis=1))
    print(f"{os.path.basename(path)}: min cosine {cos.min():.7f}")
    assert cos.min() >= 0.9999, cos
    # distinct inputs give distinct vectors (a constant output would pass the cosine check)
    assert np.max(np.abs(gpu[0] - gpu[1])) > 1e-3


def test_tanh_kernel_matches_numpy():
    """kernels/embed.cu rx_tanh vs numpy.tanh (the reference in numpy_embed.py), incl. saturation."""
    from reflex.backends.cuda_backend import CudaBackend

    b = CudaBackend()
    x = np.concatenate([np.linspace(-30, 30, 4001), np.random.default_rng(0).standard_normal(999) * 3])
    x = x.astype(np.float32).reshape(50, 100)                                  # (N, n_embd)
    got = b.to_numpy(b.tanh(x))
    assert got.shape == x.shape and np.abs(got - np.tanh(x)).max() <= 1e-6


def test_gpu_packed_pairs_match_cpu():
    """Several texts and (query, document) pairs packed into one CUDA forward under the
    block-diagonal mask give the CPU backend's classifier-head outputs (the CPU side is checked
    against transformers in test_classify.py)."""
    from reflex.embed import head_scores
    from reflex.engine import Engine

    path = os.path.join(DATA, "bert_cls_tiny_lcpp.gguf")
    ec, eg = Engine(path, backend="numpy"), Engine(path, backend="cuda")
    inputs = SENTS + [(SENTS[0], SENTS[1]), (SENTS[2], SENTS[4])]
    sc = head_scores(ec.model, ec.tokenizer, inputs)                           # (N, n_labels)
    sg = head_scores(eg.model, eg.tokenizer, inputs)
    print(f"packed max |dscore| {np.abs(sc - sg).max():.2e}")
    assert sg.shape == sc.shape and np.abs(sc - sg).max() <= 1e-2
