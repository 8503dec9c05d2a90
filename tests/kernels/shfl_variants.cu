// Every shuffle: up, down, xor and indexed, also with a sub-warp width of 8.
extern "C" __global__ void shfl_variants(const int* in, int* out) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    int v = in[i];
    int* o = out + 6 * i;
    o[0] = __shfl_up_sync(0xffffffffu, v, 3);
    o[1] = __shfl_down_sync(0xffffffffu, v, 5);
    o[2] = __shfl_xor_sync(0xffffffffu, v, 9);
    o[3] = __shfl_sync(0xffffffffu, v, (threadIdx.x * 7) & 31);
    o[4] = __shfl_up_sync(0xffffffffu, v, 2, 8);
    o[5] = __shfl_sync(0xffffffffu, v, 5, 8);
}
