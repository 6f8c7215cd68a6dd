"""Reflex: a GGUF-native, batch-1 inference engine built for cold starts."""

__version__ = "0.1.0"
