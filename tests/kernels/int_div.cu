// 32-bit division and remainder: by variables (signed and unsigned) and by constants.
extern "C" __global__ void int_div(const int* a, const int* b, int* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int x = a[i], y = b[i];
    unsigned int ux = (unsigned int)x, uy = (unsigned int)y;
    int* o = out + 8 * i;
    o[0] = (y != 0) ? x / y : 0;
    o[1] = (y != 0) ? x % y : 0;
    o[2] = (uy != 0) ? (int)(ux / uy) : 0;
    o[3] = (uy != 0) ? (int)(ux % uy) : 0;
    o[4] = x / 7;
    o[5] = x % 10;
    o[6] = (int)(ux / 1000u);
    o[7] = abs(x) + min(x, y) - max(x, y) + __mulhi(x, y) + __mul24(x, y);
}
