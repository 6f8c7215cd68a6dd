"""Token sampling, llama.cpp-style chain: repeat penalty -> top-k -> top-p -> min-p -> temperature
-> draw. temperature 0 means greedy argmax (after the repeat penalty)."""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from reflex.errors import InvalidRequest


def _num(name, v, lo=None, hi=None, lo_open=False, integer=False):
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (integer and not isinstance(v, int)):
        raise InvalidRequest(f"{name} must be {'an integer' if integer else 'a number'}, got {v!r}")
    if isinstance(v, float) and not math.isfinite(v):
        raise InvalidRequest(f"{name} must be finite, got {v!r}")
    if lo is not None and (v <= lo if lo_open else v < lo):
        raise InvalidRequest(f"{name} must be {'>' if lo_open else '>='} {lo}, got {v!r}")
    if hi is not None and v > hi:
        raise InvalidRequest(f"{name} must be <= {hi}, got {v!r}")
    return v


class Sampler:
    def __init__(self, temperature: float = 0.8, top_k: int = 40, top_p: float = 0.95,
                 min_p: float = 0.05, repeat_penalty: float = 1.0, repeat_last_n: int = 64,
                 seed: int | None = None):
        self.temperature = float(_num("temperature", temperature, lo=0))
        self.top_k = _num("top_k", top_k, lo=0, integer=True)          # 0 = disabled
        self.top_p = float(_num("top_p", top_p, lo=0, hi=1, lo_open=True))  # 1 = disabled
        self.min_p = float(_num("min_p", min_p, lo=0, hi=1))              # 0 = disabled
        self.repeat_penalty = float(_num("repeat_penalty", repeat_penalty, lo=0, lo_open=True))
        self.repeat_last_n = _num("repeat_last_n", repeat_last_n, lo=-1, integer=True)  # -1 = all
        if seed is not None:
            _num("seed", seed, lo=0, integer=True)
        self.seed = seed
        self.rng = np.random.default_rng(seed)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def _penalize(self, logits: np.ndarray, history: Sequence[int]) -> np.ndarray:
        if self.repeat_penalty == 1.0 or not history or self.repeat_last_n == 0:
            return logits
        recent = history if self.repeat_last_n < 0 else history[-self.repeat_last_n:]
        ids = np.unique(np.asarray(recent, dtype=np.int64))
        ids = ids[(ids >= 0) & (ids < logits.shape[0])]
        logits = logits.copy()
        v = logits[ids]
        logits[ids] = np.where(v > 0, v / self.repeat_penalty, v * self.repeat_penalty)
        return logits

    def sample(self, logits, history: Sequence[int] = ()) -> int:
        """Pick the next token id from one row of logits (n_vocab,)."""
        x = np.asarray(logits, dtype=np.float64).reshape(-1)
        x = self._penalize(x, history)
        if self.greedy:
            return int(np.argmax(x))
        n = x.shape[0]
        # candidates sorted by descending logit
        if self.top_k and self.top_k < n:
            idx = np.argpartition(-x, self.top_k - 1)[: self.top_k]
        else:
            idx = np.arange(n)
        idx = idx[np.argsort(-x[idx], kind="stable")]
        lg = x[idx]
        if not np.isfinite(lg[0]):  # nothing usable left (all -inf / nan): fall back to argmax
            return int(np.argmax(np.nan_to_num(x, nan=-np.inf)))
        lg = np.where(np.isnan(lg), -np.inf, lg)
        keep = len(idx)
        # top-p on the (temperature-1) softmax of the remaining candidates
        if self.top_p < 1.0:
            p = np.exp(lg - lg[0])
            p /= p.sum()
            c = np.cumsum(p)
            keep = min(keep, int(np.searchsorted(c, self.top_p)) + 1)
        # min-p relative to the best candidate
        if self.min_p > 0.0:
            thresh = lg[0] + math.log(self.min_p)
            keep = min(keep, max(1, int(np.sum(lg[:keep] >= thresh))))
        idx, lg = idx[:keep], lg[:keep]
        if keep == 1:
            return int(idx[0])
        z = (lg - lg[0]) / self.temperature
        p = np.exp(z)
        p /= p.sum()
        return int(idx[self.rng.choice(keep, p=p)])
