// Device time: clock64 and globaltimer before and after some work.
extern "C" __global__ void clock_timer(long long* clocks, unsigned long long* timers, float* sink, int iters) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    long long c0 = clock64();
    unsigned long long t0;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    float acc = (float)i;
    for (int k = 0; k < iters; ++k) acc = acc * 0.999f + 1.0f;
    sink[i] = acc;
    long long c1 = clock64();
    unsigned long long t1;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1));
    clocks[2 * i] = c0;
    clocks[2 * i + 1] = c1;
    timers[2 * i] = t0;
    timers[2 * i + 1] = t1;
}
