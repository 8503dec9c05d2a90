// Warp votes: __all_sync, __any_sync, __activemask inside a divergent branch, __syncwarp.
extern "C" __global__ void vote_any_all(const int* in, int* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    int v = (i < n) ? in[i] : 0;
    int all_pos = __all_sync(0xffffffffu, v > 0);
    int any_big = __any_sync(0xffffffffu, v > 100);
    unsigned int active = 0;
    if (v & 1) active = __activemask();
    __syncwarp();
    if (i < n) {
        out[3 * i + 0] = all_pos;
        out[3 * i + 1] = any_big;
        out[3 * i + 2] = (int)active;
    }
}
