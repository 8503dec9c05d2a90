// Per-block sums in shared memory (tree reduction, blockDim.x == 256).
extern "C" __global__ void reduce_shared(const int* in, int* block_sums, int n) {
    __shared__ int s[256];
    unsigned int tid = threadIdx.x;
    unsigned int i = blockIdx.x * blockDim.x * 2 + tid;
    int v = 0;
    if (i < n) v = in[i];
    if (i + blockDim.x < n) v += in[i + blockDim.x];
    s[tid] = v;
    __syncthreads();
    for (unsigned int stride = blockDim.x / 2; stride > 0; stride >>= 1) {
        if (tid < stride) s[tid] += s[tid + stride];
        __syncthreads();
    }
    if (tid == 0) block_sums[blockIdx.x] = s[0];
}
