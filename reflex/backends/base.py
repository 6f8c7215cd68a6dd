"""The ops interface every compute backend implements.

Models are written only against these ops, so a backend (NumPy today, GPU later) can be swapped
without touching model code. Activations are backend arrays; weights are whatever
`prepare_weight` returns (a backend may keep them quantized).

Shapes follow NumPy order: a 2-D weight is (n_out, n_in); activations are (T, ...).
"""
from __future__ import annotations

import abc

ROPE_NORM = 0  # rotate adjacent pairs (x[2i], x[2i+1]) -- llama GGUFs (converter permuted Q/K)
ROPE_NEOX = 2  # rotate halves (x[i], x[i + n_rot/2]) -- GPT-NeoX style


class Backend(abc.ABC):
    name = "base"

    # ---- weights -------------------------------------------------------------------------------
    @abc.abstractmethod
    def prepare_weight(self, raw_bytes, ggml_type: int, shape: tuple):
        """Turn a tensor's raw GGUF bytes into this backend's weight object."""

    # ---- arrays --------------------------------------------------------------------------------
    @abc.abstractmethod
    def to_numpy(self, x):
        """Backend array -> float32 numpy array on the host."""

    @abc.abstractmethod
    def zeros(self, shape: tuple):
        """A float32 zero array (used for KV caches)."""

    # ---- ops -----------------------------------------------------------------------------------
    @abc.abstractmethod
    def embed(self, w, ids):
        """Rows `ids` of the embedding table `w` (n_vocab, n_embd) -> (T, n_embd)."""

    @abc.abstractmethod
    def matmul(self, x, w):
        """x (T, n_in) @ w.T for a prepared weight w of shape (n_out, n_in) -> (T, n_out)."""

    @abc.abstractmethod
    def rms_norm(self, x, w, eps: float):
        """x / sqrt(mean(x^2, -1) + eps) * w over the last axis; w may be None."""

    @abc.abstractmethod
    def rope(self, x, pos, n_rot: int, freq_base: float, mode: int = ROPE_NORM):
        """Rotary embedding on x (T, n_head, head_dim) at positions pos (T,); the first n_rot dims
        of each head rotate, the rest pass through."""

    @abc.abstractmethod
    def attention(self, q, k_cache, v_cache, n_past: int, scale: float | None = None, *,
                  window: int = 0, mask=None, causal: bool = True):
        """Scaled-dot-product attention with grouped-query heads.

        q (T, n_head, head_dim) holds queries for cache slots n_past .. n_past+T-1; k_cache / v_cache
        (n_ctx, n_head_kv, head_dim) already hold keys/values for slots 0 .. n_past+T-1 (S slots).
        Query head h reads kv head h // (n_head // n_head_kv). Returns (T, n_head, head_dim).

        Which keys a query sees:
          mask given  -- numpy bool (T, S), True = visible; it alone decides (tree masks for system1)
          causal      -- slot j visible to query slot i iff j <= i (else: every slot is visible)
          window > 0  -- additionally i - j < window (sliding-window layers; llama.cpp's n_swa)
        """

    @abc.abstractmethod
    def kv_write(self, cache, x, start: int):
        """cache[start:start+T] = x  (x is (T, n_head_kv, head_dim))."""

    @abc.abstractmethod
    def silu(self, x):
        ...

    @abc.abstractmethod
    def gelu_tanh(self, x):
        ...

    def gelu(self, x):
        """Exact (erf) GELU, as BERT uses."""
        raise NotImplementedError(f"{self.name} backend has no gelu")

    def layer_norm(self, x, w, b, eps: float):
        """(x - mean) / sqrt(var + eps) * w + b over the last axis; w and b may be None."""
        raise NotImplementedError(f"{self.name} backend has no layer_norm")

    def add_layer_norm(self, x, r, w, b, eps: float):
        """layer_norm(x + r, w, b, eps): the post-norm residual of encoder blocks; backends may fuse it."""
        return self.layer_norm(self.add(x, r), w, b, eps)

    def linear(self, x, w, bias=None):
        """matmul(x, w) + bias (bias (n_out,) or None); backends may add the bias in place."""
        y = self.matmul(x, w)
        return y if bias is None else self.add(y, bias)

    def linear_gelu(self, x, w, bias=None):
        """gelu(linear(x, w, bias)): an encoder's ffn_up + exact GELU; backends may fuse it."""
        return self.gelu(self.linear(x, w, bias))

    @abc.abstractmethod
    def mul(self, a, b):
        ...

    @abc.abstractmethod
    def add(self, a, b):
        ...

    def swiglu(self, gate, up):
        """silu(gate) * up; backends may fuse it."""
        return self.mul(self.silu(gate), up)

    def expert_matmul(self, x, w, expert_ids, weights=None):
        """Mixture-of-experts products with a prepared 3-D weight w (n_expert, n_out, n_in).

        expert_ids (T, K) host ints select K experts per row; x is (T, n_in) (the same input for the
        K experts: gate/up) or (T, K, n_in) (one input per slot: down).
        Without `weights`: (T, K, n_out), slot [t, k] = x[t(, k)] @ w[expert_ids[t, k]].T.
        With `weights` (T, K) host floats: (T, n_out) = sum_k weights[t, k] * slot [t, k].
        Only the selected experts' weights are read."""
        raise NotImplementedError(f"{self.name} backend has no expert_matmul")

    def moe_route(self, logits, k: int, norm: bool = True):
        """Softmax top-k expert routing of router logits (T, n_expert) -> (ids, weights), backend
        arrays (T, k): ids int32, weights float32. p = float32 softmax over all experts; ids[t] are
        the k largest p[t] best first, ties to the lower expert id (NumPy's stable argsort of -p);
        weights[t, j] = p[t, ids[t, j]], divided by their sum over j when `norm`. The result stays
        on the device where the backend has one (no host read), so moe_ffn can follow inside a
        captured CUDA graph."""
        raise NotImplementedError(f"{self.name} backend has no moe_route")

    def moe_ffn(self, x, w_gate, w_up, w_down, ids, weights):
        """Routed SwiGLU experts: x (T, n_embd) -> (T, n_embd),
        out[t] = sum_k weights[t, k] * down_e(silu(gate_e(x[t])) * up_e(x[t])), e = ids[t, k].
        w_gate / w_up are prepared 3-D weights (n_expert, n_ff_exp, n_embd), w_down (n_expert,
        n_embd, n_ff_exp); ids / weights (T, K) as moe_route returns them (backend arrays, read on
        the device). Equal to expert_matmul(gate), expert_matmul(up), swiglu, expert_matmul(down,
        weights); only the selected experts' weights are read."""
        raise NotImplementedError(f"{self.name} backend has no moe_ffn")

    def moe_capturable(self, w_gate, w_up, w_down) -> bool:
        """Whether a T = 1 moe_route + moe_ffn over these weights runs without host data, so a
        decode step using them can be captured into a CUDA graph (backends without graphs: False)."""
        return False
