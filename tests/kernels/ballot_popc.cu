// Warp votes: per element, the number of lanes of its warp whose value is positive and
// the rank of this lane among them (ballot + popc with lane masks).
extern "C" __global__ void ballot_popc(const int* in, int* count, int* rank, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    int v = (i < n) ? in[i] : 0;
    unsigned int mask = __ballot_sync(0xffffffffu, v > 0);
    unsigned int lane = threadIdx.x & 31;
    if (i < n) {
        count[i] = __popc(mask);
        rank[i] = (v > 0) ? __popc(mask & ((1u << lane) - 1u)) : -1;
    }
}
