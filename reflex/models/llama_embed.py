"""The `llama-embed` architecture (llama.cpp's name for Nemotron-embed style models): the llama
decoder with bidirectional attention, used as an embedder (MEAN pooling unless the file says
otherwise).

Weights, hyperparameters and RoPE (NORM) are exactly llama's, read under the `llama-embed.*` keys;
the only difference is that every token sees every other token of its sequence, so forward()
defaults to an all-visible mask instead of the causal one.
"""
from __future__ import annotations

import numpy as np

from reflex.backends.base import Backend
from reflex.models import llama

POOLING_MEAN = 1


class Model(llama.Model):
    supports_packing = False  # one sequence per forward (the K/V cache holds one sequence)

    def __init__(self, f, backend: Backend, hp: llama.HParams):
        super().__init__(f, backend, hp)
        # llama.cpp's converter writes no pooling key for LlamaBidirectionalModel; MEAN is what
        # these models use (sentence-transformers mean pooling)
        self.pooling_type = int(f.get(f"{hp.arch}.pooling_type", POOLING_MEAN))
        self.causal = bool(f.get(f"{hp.arch}.attention.causal", False))

    def forward(self, token_ids, cache, last_only: bool = False, positions=None, attn_mask=None,
                output: str = "logits"):
        """llama.Model.forward with bidirectional attention by default: an all-visible
        (T, cache.n + T) mask unless attn_mask is given."""
        if attn_mask is None and not self.causal:
            T = np.asarray(token_ids).reshape(-1).shape[0]
            attn_mask = np.ones((T, cache.n + T), dtype=bool)
        return super().forward(token_ids, cache, last_only=last_only, positions=positions,
                               attn_mask=attn_mask, output=output)


def load(f, backend: Backend, arch: str = "llama-embed") -> Model:
    return Model(f, backend, llama.HParams.from_gguf(f, arch))
