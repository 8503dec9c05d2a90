// 64-bit integer arithmetic: multiply-high, division and remainder, shifts and compares.
extern "C" __global__ void int64_ops(const long long* a, const long long* b, long long* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    long long x = a[i], y = b[i];
    unsigned long long ux = (unsigned long long)x, uy = (unsigned long long)y;
    long long* o = out + 8 * i;
    o[0] = x * y;
    o[1] = (long long)__umul64hi(ux, uy);
    o[2] = __mul64hi(x, y);
    o[3] = (y != 0) ? x / y : 0;
    o[4] = (y != 0) ? x % y : 0;
    o[5] = (uy != 0) ? (long long)(ux / uy) : 0;
    o[6] = (x >> (y & 63)) ^ (long long)(ux >> (uy & 63)) ^ (long long)(ux << (y & 31));
    o[7] = (x < y) ? llabs(x - y) : llmin(x, y) + llmax(x, y);
}
