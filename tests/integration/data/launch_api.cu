// Kernels of the guest module API tests (tests/integration/test_modules.py); their PTX,
// launch_api.ptx beside this file, is `nvcc --ptx -arch=sm_80 launch_api.cu` (nvcc 13.0).
struct Affine { float scale; int shift; double bias; };
__constant__ float coeffs[4];
__device__ int counter;

extern "C" __global__ void saxpy(float a, const float *x, float *y, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x)
        y[i] = a * x[i] + y[i];
}
extern "C" __global__ void poly(const float *x, float *y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { float v = x[i]; y[i] = coeffs[0] + v * (coeffs[1] + v * (coeffs[2] + v * coeffs[3])); atomicAdd(&counter, 1); }
}
extern "C" __global__ void affine(Affine t, const float *x, double *y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = (double)(x[i] * t.scale + (float)t.shift) + t.bias;
}
extern "C" __global__ void store_at(unsigned long long addr, int v) {
    *(int *)addr = v;
}
extern "C" __global__ void spin(volatile int *flag) {
    while (*flag == 0) { }
}
extern "C" __global__ void __launch_bounds__(64) small_block(int *out) {
    out[threadIdx.x] = threadIdx.x;
}
struct Big { float v[64]; };
extern "C" __global__ void dot_big(Big w, const float *x, float *out) {
    float s = 0.0f;
    for (int i = 0; i < 64; i++) s += w.v[i] * x[i];
    out[threadIdx.x] = s;
}
