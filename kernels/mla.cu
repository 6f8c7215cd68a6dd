// mla.cu -- Multi-head latent attention ops (deepseek2): whatever MLA needs beyond the generic ops.
// NumPy reference: reflex/backends/numpy_mla.py. (Kernels are added here with their launch shape.)
#pragma once
