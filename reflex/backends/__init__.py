"""Compute backends. `get_backend(name)` returns a fresh backend instance."""
from __future__ import annotations

from reflex.backends.base import ROPE_NEOX, ROPE_NORM, Backend
from reflex.errors import InvalidRequest

__all__ = ["Backend", "ROPE_NORM", "ROPE_NEOX", "get_backend", "BACKENDS"]

BACKENDS = ("numpy", "cuda")


def get_backend(name: str = "numpy") -> Backend:
    if name in ("numpy", "cpu"):
        from reflex.backends.numpy_backend import NumpyBackend

        return NumpyBackend()
    if name in ("cuda", "gpu"):
        from reflex.backends.cuda_backend import CudaBackend

        return CudaBackend()
    raise InvalidRequest(f"unknown backend {name!r} (known: {', '.join(BACKENDS)})")
