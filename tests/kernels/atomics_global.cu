// Global atomics of every kind on a small array of counters.
extern "C" __global__ void atomics_global(const int* in, int* ints, unsigned int* uints,
                                          float* f, double* d, unsigned long long* u64, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int v = in[i];
    atomicAdd(&ints[0], v);
    atomicMax(&ints[1], v);
    atomicMin(&ints[2], v);
    atomicAnd(&ints[3], ~(1 << (i & 31)));
    atomicOr(&ints[4], 1 << (i & 31));
    atomicXor(&ints[5], v);
    atomicInc(&uints[0], 1000000u);
    atomicDec(&uints[1], 1000000u);
    atomicAdd(&uints[2], 1u);
    atomicExch(&uints[3], 7u);
    atomicAdd(&f[0], 0.5f);
    atomicAdd(&d[0], 0.25);
    atomicAdd(&u64[0], (unsigned long long)(v & 0xff) << 33);
    atomicMax(&u64[1], (unsigned long long)i);
    int old = ints[6], assumed;
    do { assumed = old; old = atomicCAS(&ints[6], assumed, assumed + 2); } while (old != assumed);
}
