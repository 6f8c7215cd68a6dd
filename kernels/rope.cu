// rope.cu -- rotary position embedding, modes NORM (adjacent pairs) and NEOX (halves).
//
// rx_rope(x, y, pos, n_tok, n_head, head_dim, n_rot, freq_base, mode, pos_dyn):
//   for token t, head h, pair i < n_rot/2: theta = pos[t] * base^(-2i / n_rot) (in double, as the
//   NumPy reference), NORM rotates (x[2i], x[2i+1]), NEOX rotates (x[i], x[i + n_rot/2]); dims
//   >= n_rot are copied. pos is int32 on the device; when pos_dyn is non-null, token t sits at
//   position *pos_dyn + t (a captured decode step reads its position from the step state).
// Launch: grid (n_tok * n_head), threads = head_dim / 2 rounded up to a multiple of 32.
#include "common.cuh"

RX_EXTERN void rx_rope(const float* x, float* y, const int* pos, int n_head, int head_dim, int n_rot,
                       float freq_base, int mode, const int* pos_dyn) {
    int th = blockIdx.x;  // t * n_head + h
    int t = th / n_head;
    const float* xr = x + (long)th * head_dim;
    float* yr = y + (long)th * head_dim;
    int p = pos_dyn ? (*pos_dyn + t) : pos[t];
    int half = n_rot / 2;
    for (int i = threadIdx.x; i < head_dim / 2; i += blockDim.x) {
        if (i < half) {
            double f = pow((double)freq_base, -(double)(2 * i) / (double)n_rot);
            double a = (double)p * f;
            float c = (float)cos(a), s = (float)sin(a);
            int i0 = mode == 0 ? 2 * i : i;
            int i1 = mode == 0 ? 2 * i + 1 : i + half;
            float x0 = xr[i0], x1 = xr[i1];
            yr[i0] = x0 * c - x1 * s;
            yr[i1] = x0 * s + x1 * c;
        }
    }
    for (int i = n_rot + threadIdx.x; i < head_dim; i += blockDim.x) yr[i] = xr[i];
}
