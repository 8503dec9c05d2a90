// y = A x with one warp per row: lanes stride over the row, then a butterfly (xor) shuffle.
extern "C" __global__ void matvec_warp(const float* A, const float* x, float* y, int rows, int cols) {
    int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (warp >= rows) return;
    float acc = 0.0f;
    for (int c = lane; c < cols; c += 32) acc += A[warp * cols + c] * x[c];
    for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
    if (lane == 0) y[warp] = acc;
}
