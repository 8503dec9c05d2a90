// Inclusive prefix sum inside each block (Hillis-Steele, double-buffered shared memory).
#define BLOCK 128
extern "C" __global__ void block_scan(const int* in, int* out, int n) {
    __shared__ int buf[2][BLOCK];
    int tid = threadIdx.x;
    int i = blockIdx.x * BLOCK + tid;
    int cur = 0;
    buf[cur][tid] = (i < n) ? in[i] : 0;
    __syncthreads();
    for (int off = 1; off < BLOCK; off <<= 1) {
        int v = buf[cur][tid];
        if (tid >= off) v += buf[cur][tid - off];
        buf[1 - cur][tid] = v;
        cur = 1 - cur;
        __syncthreads();
    }
    if (i < n) out[i] = buf[cur][tid];
}
