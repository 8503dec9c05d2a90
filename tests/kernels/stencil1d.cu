// 1-D stencil of radius 3 with a shared-memory halo; blockDim.x == 128.
#define R 3
#define B 128
extern "C" __global__ void stencil1d(const float* in, float* out, int n) {
    __shared__ float s[B + 2 * R];
    int g = blockIdx.x * B + threadIdx.x;
    int l = threadIdx.x + R;
    s[l] = (g < n) ? in[g] : 0.0f;
    if (threadIdx.x < R) {
        s[l - R] = (g - R >= 0 && g - R < n) ? in[g - R] : 0.0f;
        s[l + B] = (g + B < n) ? in[g + B] : 0.0f;
    }
    __syncthreads();
    if (g >= n) return;
    float acc = 0.0f;
#pragma unroll
    for (int k = -R; k <= R; ++k) acc += s[l + k] * (float)(R + 1 - (k < 0 ? -k : k));
    out[g] = acc;
}
