// Block-wide predicate reductions: __syncthreads_count, __syncthreads_and, __syncthreads_or.
extern "C" __global__ void bar_red(const int* in, int* out) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    int v = in[i];
    int cnt = __syncthreads_count(v > 0);
    int all = __syncthreads_and(v > -100);
    int any = __syncthreads_or(v > 1000);
    if (threadIdx.x == 0) {
        out[3 * blockIdx.x + 0] = cnt;
        out[3 * blockIdx.x + 1] = all;
        out[3 * blockIdx.x + 2] = any;
    }
}
