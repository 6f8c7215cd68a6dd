// rope.cu -- rotary position embedding, modes NORM (adjacent pairs) and NEOX (halves).
//
// rx_rope(x, y, x2, y2, n_head2, pos, inv_freq, n_head, head_dim, n_rot, mode, pos_dyn):
//   for token t, head h, pair i < n_rot/2: theta = pos[t] * inv_freq[i], inv_freq[i] =
//   base^(-2i / n_rot) in double (from the host, as the NumPy reference); theta is reduced to
//   [-pi, pi] in double, then sin/cos in float (exact to float rounding at any position), NORM rotates (x[2i], x[2i+1]), NEOX rotates (x[i], x[i + n_rot/2]); dims
//   >= n_rot are copied. pos is int32 on the device; when pos_dyn is non-null, token t sits at
//   position *pos_dyn + t (a captured decode step reads its position from the step state).
//   A second tensor x2 (T, n_head2, head_dim) at the same positions -- K beside Q -- may ride
//   along in the same launch (x2 null, n_head2 0 otherwise).
// Launch: grid (T * (n_head + n_head2)), threads = head_dim / 2 rounded up to a multiple of 32.
#include "common.cuh"

RX_EXTERN void rx_rope(const float* x, float* y, const float* x2, float* y2, int n_head2, const int* pos,
                       const double* inv_freq, int n_head, int head_dim, int n_rot, int mode, const int* pos_dyn) {
    int T = gridDim.x / (n_head + n_head2);
    int th = blockIdx.x;
    int t, nh;
    if (th >= T * n_head) {  // the second tensor
        th -= T * n_head;
        x = x2;
        y = y2;
        nh = n_head2;
    } else {
        nh = n_head;
    }
    t = th / nh;
    const float* xr = x + (long)th * head_dim;
    float* yr = y + (long)th * head_dim;
    int p = pos_dyn ? (*pos_dyn + t) : pos[t];
    int half = n_rot / 2;
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        double a = (double)p * inv_freq[i];
        a -= 6.283185307179586 * rint(a * 0.15915494309189535);
        float s, c;
        sincosf((float)a, &s, &c);
        int i0 = mode == 0 ? 2 * i : i;
        int i1 = mode == 0 ? 2 * i + 1 : i + half;
        float x0 = xr[i0], x1 = xr[i1];
        yr[i0] = x0 * c - x1 * s;
        yr[i1] = x0 * s + x1 * c;
    }
    for (int i = n_rot + threadIdx.x; i < head_dim; i += blockDim.x) yr[i] = xr[i];
}
