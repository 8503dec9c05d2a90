// Dynamic shared memory (extern __shared__): each block reverses its chunk of doubles.
extern "C" __global__ void dynamic_reverse(const double* in, double* out, int n) {
    extern __shared__ double chunk[];
    int base = blockIdx.x * blockDim.x;
    int t = threadIdx.x;
    if (base + t < n) chunk[t] = in[base + t];
    __syncthreads();
    int count = min((int)blockDim.x, n - base);
    if (t < count) out[base + t] = chunk[count - 1 - t];
}
