// Sum of n floats: warp-shuffle reduction, one atomicAdd per warp.
__inline__ __device__ float warp_sum(float v) {
    for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
    return v;
}
extern "C" __global__ void reduce_shfl(const float* in, float* out, int n) {
    float v = 0.0f;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) v += in[i];
    v = warp_sum(v);
    if ((threadIdx.x & 31) == 0) atomicAdd(out, v);
}
