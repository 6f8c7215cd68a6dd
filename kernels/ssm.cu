// ssm.cu -- Mamba-2 selective-state-space ops (granitehybrid): ssm_conv (the causal depthwise conv1d shared with qwen35's Gated DeltaNet) and the Mamba-2 selective scan.
// NumPy reference: reflex/backends/numpy_ssm.py. (Kernels are added here with their launch shape.)
#pragma once
