// Module globals: __device__ variables with initializers, a lookup table and a counter.
__device__ int lut[8] = {3, 1, 4, 1, 5, 9, 2, 6};
__device__ float scale = 1.5f;
__device__ unsigned int counter;
__device__ double offsets[2] = {0.25, -0.5};
extern "C" __global__ void globals(const int* in, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    unsigned int ticket = atomicAdd(&counter, 1u);
    out[i] = lut[in[i] & 7] * scale + (float)offsets[i & 1] + (ticket < (unsigned)n ? 0.0f : 1000.0f);
}
