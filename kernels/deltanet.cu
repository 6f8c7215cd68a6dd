// deltanet.cu -- Gated DeltaNet ops (qwen35 linear-attention layers): the gated delta rule recurrence and its helpers.
// NumPy reference: reflex/backends/numpy_deltanet.py. (Kernels are added here with their launch shape.)
#pragma once
