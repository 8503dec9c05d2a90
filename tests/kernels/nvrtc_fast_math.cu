// Compiled by NVRTC with --use_fast_math: the approximate, flush-to-zero forms
// (ex2/lg2/sin/cos .approx.ftz, div.approx/full, rcp/rsqrt .approx).
extern "C" __global__ void fast_math(const float* x, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float v = x[i];
    out[6 * i + 0] = sinf(v) * cosf(v);
    out[6 * i + 1] = expf(v * 0.5f);
    out[6 * i + 2] = logf(v * v + 1.0f);
    out[6 * i + 3] = v / (fabsf(v) + 1.0f);
    out[6 * i + 4] = sqrtf(fabsf(v)) + rsqrtf(fabsf(v) + 1.0f);
    out[6 * i + 5] = tanhf(v) + powf(fabsf(v) + 1.0f, 0.75f);
}
