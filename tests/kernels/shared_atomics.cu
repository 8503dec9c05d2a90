// Shared-memory atomics on 64-bit counters and a shared float accumulator, with
// atomicCAS-based max on floats.
__device__ float atomic_max_float(float* addr, float v) {
    int* p = (int*)addr;
    int old = *p, assumed;
    do {
        assumed = old;
        if (__int_as_float(assumed) >= v) break;
        old = atomicCAS(p, assumed, __float_as_int(v));
    } while (old != assumed);
    return __int_as_float(old);
}
extern "C" __global__ void shared_atomics(const float* x, unsigned long long* counts, float* stats, int n) {
    __shared__ unsigned long long c[4];
    __shared__ float s_sum, s_max;
    if (threadIdx.x < 4) c[threadIdx.x] = 0;
    if (threadIdx.x == 0) { s_sum = 0.0f; s_max = -1e30f; }
    __syncthreads();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v = x[i];
        atomicAdd(&c[(v > 0.0f) + 2 * (v > 0.5f)], 1ull);
        atomicAdd(&s_sum, v);
        atomic_max_float(&s_max, v);
    }
    __syncthreads();
    if (threadIdx.x < 4) atomicAdd(&counts[threadIdx.x], c[threadIdx.x]);
    if (threadIdx.x == 0) { atomicAdd(&stats[0], s_sum); atomic_max_float(&stats[1], s_max); }
}
