// Double-precision math: arithmetic, division, sqrt, fma, exp and log from libdevice.
extern "C" __global__ void f64_math(const double* x, double* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    double v = x[i];
    double r = sqrt(v) + v / (1.0 + v) + fma(v, 0.5, -0.25);
    out[4 * i + 0] = r;
    out[4 * i + 1] = exp(v * 0.125);
    out[4 * i + 2] = log(v + 1.0);
    out[4 * i + 3] = fmin(v, 3.5) * fmax(v, 0.25) - floor(v) + ceil(v * 0.5);
}
