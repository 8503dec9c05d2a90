// Real .func calls (__noinline__) with local arrays: each thread sorts 8 values and
// returns their median and a checksum computed by a second-level call.
__device__ __noinline__ int mix(int a, int b) { return (a * 31) ^ (b + 7); }

__device__ __noinline__ int sort8_median(int* v, int* checksum) {
    for (int i = 1; i < 8; ++i) {
        int x = v[i], j = i - 1;
        while (j >= 0 && v[j] > x) { v[j + 1] = v[j]; --j; }
        v[j + 1] = x;
    }
    int c = 0;
    for (int i = 0; i < 8; ++i) c = mix(c, v[i]);
    *checksum = c;
    return (v[3] + v[4]) / 2;
}

extern "C" __global__ void device_calls(const int* in, int* median, int* checksum, int n) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n) return;
    int v[8];
    for (int k = 0; k < 8; ++k) v[k] = in[8 * t + ((k * 5 + t) & 7)];
    int c;
    median[t] = sort8_median(v, &c);
    checksum[t] = c;
}
