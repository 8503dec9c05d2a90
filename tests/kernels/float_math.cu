// Single-precision math functions from the CUDA math library (IEEE and intrinsic forms).
extern "C" __global__ void float_math(const float* x, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float v = x[i];
    float* o = out + 12 * i;
    o[0] = sinf(v);
    o[1] = cosf(v);
    o[2] = expf(v);
    o[3] = logf(fabsf(v) + 1.0f);
    o[4] = tanhf(v);
    o[5] = sqrtf(fabsf(v));
    o[6] = rsqrtf(fabsf(v) + 1.0f);
    o[7] = fminf(v, 0.5f) + fmaxf(v, -0.5f);
    o[8] = floorf(v) + ceilf(v) + roundf(v) + truncf(v);
    o[9] = copysignf(2.0f, v) / (v * v + 1.0f);
    o[10] = __expf(v) + __sinf(v) + __logf(fabsf(v) + 2.0f);
    o[11] = powf(fabsf(v) + 0.5f, 1.5f);
}
