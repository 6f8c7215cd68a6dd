"""Whole-model parity: CUDA backend vs the NumPy backend on the same synthetic GGUF files.

Models are written at test time with reflex.synth presets (real shapes, random weights, the real
SmolLM2 tokenizer from a vocab-only GGUF: $REFLEX_VOCAB_GGUF, else made from the store's smollm2).
For every architecture whose model file exists: the CPU greedy sequence of 32 tokens; the GPU's
teacher-forced logits on that sequence (max |diff| and relative error within the stated
tolerance) with the same top-1 at every step whose CPU top-1/top-2 margin exceeds 4x that step's
logit difference (random weights give some near-ties; at least 24 of the 32 steps must be such
steps, so the check cannot pass vacuously); and the GPU's own free-running greedy tokens (CUDA-graph
decode, and eager decode) identical to the CPU's up to the first near-tie step (all 32 if none).
The NumPy backend's own correctness is proven against transformers in test_llama.py.
Skipped cleanly where there is no CUDA GPU or the kernels are not built (CI has no GPU).
"""
import importlib
import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from reflex.backends import cuda_driver

pytestmark = pytest.mark.skipif(
    not (os.path.exists(cuda_driver.default_fatbin()) and cuda_driver.available()),
    reason="no CUDA GPU or kernels not built")

N_GEN = 32
LOGIT_MAX_ABS = 2e-2   # f16 KV cache + different summation order over 30 layers
LOGIT_REL = 5e-3
PROMPT = "The quick brown fox jumps over the lazy dog. In a distant land, there lived"
TINY = dict(embedding_length=128, block_count=2, feed_forward_length=256,
            **{"attention.head_count": 4, "attention.head_count_kv": 2, "rope.dimension_count": 32})
CASES = [("llama", "smollm2-135m", TINY), ("llama", "smollm2-135m", None),
         ("gemma3", "gemma3-270m", None), ("qwen3", "qwen3-0.6b", None),
         ("qwen2", "qwen2-0.5b", {"block_count": 6})]
REPORT = os.environ.get("REFLEX_PARITY_REPORT")


def _load(path, backend):
    from reflex.gguf import GGUFFile
    f = GGUFFile(path)
    arch = f.get("general.architecture")
    mod = importlib.import_module(f"reflex.models.{arch}")
    return mod.load(f, backend, arch=arch)


def _model_path(tmp_path_factory, vocab, preset, overrides):
    from reflex.synth import synthesize_preset
    name = preset + ("-" + "-".join(f"{k}{v}" for k, v in overrides.items()) if overrides else "")
    name = name.replace(".", "_")[:80]
    out = tmp_path_factory.mktemp("models") / f"{name}.gguf"
    synthesize_preset(vocab, out, preset, seed=1, overrides=overrides)
    return str(out)


def _prompt_ids(path):
    from reflex.gguf import GGUFFile
    from reflex.tokenizer import Tokenizer
    return Tokenizer.from_gguf(GGUFFile(path)).encode(PROMPT)


def _cpu_greedy(path, ids):
    from reflex.backends.numpy_backend import NumpyBackend
    m = _load(path, NumpyBackend())
    cache = m.new_cache(len(ids) + N_GEN + 1)
    logits, toks = [], []
    lg = m.forward(ids, cache, last_only=True)[-1]
    for _ in range(N_GEN):
        logits.append(lg)
        toks.append(int(np.argmax(lg)))
        lg = m.forward([toks[-1]], cache, last_only=True)[-1]
    return toks, np.array(logits)


@pytest.mark.parametrize("arch,preset,overrides", CASES, ids=["llama-tiny", "smollm2-135m", "gemma3-270m",
                                                              "qwen3-0.6b", "qwen2-0.5b-6layers"])
def test_gpu_matches_cpu(tmp_path_factory, vocab, arch, preset, overrides):
    """At the default fusion level (REFLEX_CUDA_FUSE=2: norm + RoPE + KV write and add + norm
    folded into the products, in eager and graph-captured decode)."""
    _gpu_vs_cpu(tmp_path_factory, vocab, arch, preset, overrides, fuse=None)


@pytest.mark.parametrize("arch,preset,overrides", [CASES[0], CASES[2], CASES[3]],
                         ids=["llama-tiny", "gemma3-270m", "qwen3-0.6b"])
def test_gpu_matches_cpu_fuse1(tmp_path_factory, vocab, arch, preset, overrides):
    """The same checks with only the level-1 fusions (REFLEX_CUDA_FUSE=1), the device switch back."""
    _gpu_vs_cpu(tmp_path_factory, vocab, arch, preset, overrides, fuse=1)


def _gpu_vs_cpu(tmp_path_factory, vocab, arch, preset, overrides, fuse):
    if importlib.util.find_spec(f"reflex.models.{arch}") is None:
        pytest.skip(f"reflex/models/{arch}.py not in the tree")
    from reflex.backends.cuda_backend import CudaBackend, GreedyDecoder
    path = _model_path(tmp_path_factory, vocab, preset, overrides)
    ids = _prompt_ids(path)
    cpu_toks, cpu_logits = _cpu_greedy(path, ids)

    gb = CudaBackend()
    if fuse is not None:
        gb.fuse = fuse
    m = _load(path, gb)
    # teacher-forced logits on the CPU's sequence (eager launches, logits to the host)
    cache = m.new_cache(len(ids) + N_GEN + 1)
    g = [m.forward(ids, cache, last_only=True)[-1]]
    for t in cpu_toks[:-1]:
        g.append(m.forward([t], cache, last_only=True)[-1])
    g = np.array(g)
    diff = np.abs(g - cpu_logits).max(axis=1)                           # per step
    rel = float(np.linalg.norm(g - cpu_logits) / np.linalg.norm(cpu_logits))
    srt = np.sort(cpu_logits, axis=1)
    margin = srt[:, -1] - srt[:, -2]
    ok_steps = margin > 4 * np.maximum(diff, 1e-6)
    n_check = int(np.argmin(ok_steps)) if not ok_steps.all() else N_GEN  # first near-tie ends the prefix
    tf_top1 = np.argmax(g, axis=1)

    # free-running greedy on the GPU through the CUDA-graph decoder
    cache2 = m.new_cache(len(ids) + N_GEN + 1)
    dec = GreedyDecoder(gb, m, cache2)
    toks = [dec.prefill(ids)]
    while len(toks) < N_GEN:
        toks.append(dec.step(toks[-1]))
    # and without the graph (eager launches, device argmax)
    cache3 = m.new_cache(len(ids) + N_GEN + 1)
    dec3 = GreedyDecoder(gb, m, cache3, use_graph=False)
    toks3 = [dec3.prefill(ids)]
    while len(toks3) < N_GEN:
        toks3.append(dec3.step(toks3[-1]))
    info = dict(case=preset + ("-small" if overrides else ""), fuse=gb.fuse, max_abs=float(diff.max()), rel=rel,
                min_margin=float(margin.min()), n_prefix=n_check, n_margin_ok=int(ok_steps.sum()),
                free_running_all_equal=(toks == cpu_toks), cpu=cpu_toks, gpu_graph=toks,
                gpu_eager=toks3, capture_s=dec.capture_s, mem=gb.memory())
    print(json.dumps(info))
    if REPORT:
        with open(REPORT, "a") as fh:
            fh.write(json.dumps(info) + "\n")
    assert diff.max() <= LOGIT_MAX_ABS and rel <= LOGIT_REL, info
    assert ok_steps.sum() >= 24, info
    assert np.array_equal(tf_top1[ok_steps], np.array(cpu_toks)[ok_steps]), info
    assert toks[:n_check] == cpu_toks[:n_check], info
    assert toks3[:n_check] == cpu_toks[:n_check], info
    assert cache2.n == len(ids) + N_GEN - 1
    # resident weights stay in their block format: <= 1.02x the file's tensor bytes
    from reflex.gguf import GGUFFile
    f = GGUFFile(path)
    tensor_bytes = sum(t.nbytes for t in f.tensors.values())
    assert gb.weight_bytes <= 1.02 * tensor_bytes


def test_generation_leaves_cupy_cache_empty(tmp_path_factory, vocab, tmp_path):
    """A full generation in a fresh process JIT-compiles nothing (CUPY_CACHE_DIR stays empty) and
    never imports CuPy: every kernel comes from the AOT fatbin."""
    path = _model_path(tmp_path_factory, vocab, "smollm2-135m", TINY)
    cache_dir = tmp_path / "cupy_cache"
    cache_dir.mkdir()
    code = ("import sys, json; from reflex.engine import Engine; "
            f"e = Engine({path!r}, backend='cuda'); r = e.generate('Hello there', max_tokens=16, temperature=0); "
            "print(json.dumps({'n': len(r.tokens), 'cupy': 'cupy' in sys.modules}))")
    env = dict(os.environ, CUPY_CACHE_DIR=str(cache_dir))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["n"] >= 1 and out["cupy"] is False
    assert list(cache_dir.iterdir()) == []


@pytest.mark.parametrize("last_n", [8, 64])
def test_greedy_decoder_repeat_penalty(tmp_path_factory, vocab, last_n):
    """The device repeat penalty (kernels/sample.cu rx_repeat_penalty + rx_ring_push inside the
    captured step) picks what the host path picks: Sampler(temperature 0, repeat_penalty 1.5,
    repeat_last_n).sample over the whole history, on this backend's own eager logits copied to the
    host -- so CPU/GPU rounding cannot part them, only the penalty and the window can. 32 tokens,
    graph and eager; the penalty must change the unpenalized greedy sequence (else this proves
    nothing)."""
    from reflex.backends.cuda_backend import CudaBackend, GreedyDecoder
    from reflex.sampling import Sampler
    path = _model_path(tmp_path_factory, vocab, "smollm2-135m", TINY)
    ids, pen = _prompt_ids(path), 1.5
    gb = CudaBackend()
    m = _load(path, gb)

    def host(penalty):
        c, hist, out = m.new_cache(len(ids) + N_GEN + 1), list(ids), []
        s = Sampler(temperature=0, repeat_penalty=penalty, repeat_last_n=last_n)
        lg = m.forward(ids, c, last_only=True)[-1]
        while len(out) < N_GEN:
            out.append(s.sample(lg, hist))
            hist.append(out[-1])
            lg = m.forward([out[-1]], c, last_only=True)[-1]
        return out

    ref = host(pen)
    assert ref != host(1.0)
    for use_graph in (True, False):
        dec = GreedyDecoder(gb, m, m.new_cache(len(ids) + N_GEN + 1), use_graph=use_graph,
                            repeat_penalty=pen, repeat_last_n=last_n, history=ids)
        toks = [dec.prefill(ids)]
        while len(toks) < N_GEN:
            toks.append(dec.step(toks[-1]))
        assert toks == ref, (use_graph, toks, ref)
