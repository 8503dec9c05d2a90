// A per-thread array indexed at run time (so it lives in local memory): a small
// moving-window histogram of the thread's inputs.
extern "C" __global__ void local_array(const int* in, int* out, int n, int len) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n) return;
    int counts[16];
    for (int k = 0; k < 16; ++k) counts[k] = 0;
    for (int k = 0; k < len; ++k) counts[in[t * len + k] & 15] += k + 1;
    int best = 0;
    for (int k = 1; k < 16; ++k) if (counts[k] > counts[best]) best = k;
    out[2 * t] = best;
    out[2 * t + 1] = counts[best];
}
