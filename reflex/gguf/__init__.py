"""GGUF file access: `GGUFFile(path)` (memory-mapped, zero-copy)."""
from reflex.gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType, Keys
from reflex.gguf.reader import GGUFFile, StringArray, TensorInfo, open_gguf

__all__ = ["GGUFFile", "TensorInfo", "StringArray", "open_gguf", "GGMLQuantizationType",
           "GGUFValueType", "GGML_QUANT_SIZES", "Keys"]
