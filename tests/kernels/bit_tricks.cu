// Integer bit tricks: popc, clz, ffs, brev, rotates, byte permutes, bit-field extract and insert.
extern "C" __global__ void bit_tricks(const unsigned int* in, unsigned int* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    unsigned int x = in[i];
    unsigned long long w = ((unsigned long long)x << 32) | (x ^ 0x9e3779b9u);
    out[12 * i + 0] = __popc(x);
    out[12 * i + 1] = __clz(x);
    out[12 * i + 2] = __ffs(x);
    out[12 * i + 3] = __brev(x);
    out[12 * i + 4] = (x << 7) | (x >> 25);
    out[12 * i + 5] = __byte_perm(x, 0x01234567u, 0x6152);
    out[12 * i + 6] = (x >> 5) & 0x3ffu;
    out[12 * i + 7] = (x & ~(0xffu << 12)) | ((i & 0xffu) << 12);
    out[12 * i + 8] = __popcll(w) + __clzll(w);
    out[12 * i + 9] = (unsigned int)(__brevll(w) >> 16);
    out[12 * i + 10] = x & (x - 1u);
    out[12 * i + 11] = __funnelshift_r(x, x * 3u, i & 31);
}
