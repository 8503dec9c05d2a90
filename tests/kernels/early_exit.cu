// Divergent early exits: several return paths depending on the data.
extern "C" __global__ void early_exit(const int* in, int* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int v = in[i];
    if (v < 0) { out[i] = -1; return; }
    if (v == 0) return;              // out[i] keeps its old value
    int acc = 0;
    for (int k = 0; k < v; ++k) {
        if (k > 40) { out[i] = 1000 + k; return; }
        acc += k * k;
    }
    out[i] = acc;
}
