// Data-dependent loop trip counts with break and continue (Collatz steps, capped).
extern "C" __global__ void collatz(const unsigned int* start, unsigned int* steps, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    unsigned int x = start[i];
    unsigned int s = 0;
    while (x != 1u) {
        if (s >= 500u) break;
        ++s;
        if (x & 1u) { x = 3u * x + 1u; continue; }
        x >>= 1;
    }
    steps[i] = s;
}
