// Half-precision conversions: float -> half (round to nearest) -> float, and half
// arithmetic done in float.
#include <cuda_fp16.h>
extern "C" __global__ void f16_convert(const float* in, __half* h, float* back, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    __half v = __float2half_rn(in[i]);
    h[i] = v;
    back[2 * i] = __half2float(v);
    back[2 * i + 1] = __half2float(__float2half_rz(in[i] * 3.0f));
}
