// Selects and clamps: ternaries, saturate, integer and float min/max, unsigned compares.
extern "C" __global__ void clamp_select(const float* x, const int* k, float* out, int* iout, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float v = x[i];
    int a = k[i];
    out[3 * i + 0] = __saturatef(v);
    out[3 * i + 1] = (v > 0.25f) ? v * 2.0f : -v;
    out[3 * i + 2] = fminf(fmaxf(v, -1.0f), 1.0f) + ((v != v) ? 100.0f : 0.0f);
    iout[3 * i + 0] = max(min(a, 50), -50);
    iout[3 * i + 1] = ((unsigned int)a > 1000u) ? 1 : 0;
    iout[3 * i + 2] = (a > 0 && v < 0.0f) || (a < 0 && v > 0.0f) ? 7 : -7;
}
