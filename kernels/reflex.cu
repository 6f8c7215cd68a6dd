// reflex.cu -- the one translation unit nvcc compiles into reflex/_kernels/reflex.fatbin.
// Each op family lives in its own file; see the header of each for what it computes.
#include "dequant.cu"
#include "matvec.cu"
#include "matmul.cu"
#include "norm.cu"
#include "rope.cu"
#include "attention.cu"
#include "elementwise.cu"
#include "sample.cu"
#include "ssm.cu"
#include "deltanet.cu"
#include "mla.cu"
#include "embed.cu"
