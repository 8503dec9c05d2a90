// Kernels of one's own for examples/cuda_kernels.py (nvcc --ptx -arch=sm_80 gives
// cuda_kernels.ptx beside this file).

__constant__ float coeffs[4];  // set from the host through the module's global

struct Affine {
    float scale;
    float shift;
};

// y[i] = c0 + c1 x + c2 x^2 + c3 x^3, then scaled and shifted: a struct passed by value
extern "C" __global__ void poly_affine(const float *x, float *y, Affine t, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v = x[i];
        float p = coeffs[0] + v * (coeffs[1] + v * (coeffs[2] + v * coeffs[3]));
        y[i] = t.scale * p + t.shift;
    }
}

// the sum of x into *out: a shared-memory tree per block, then one atomic per block
extern "C" __global__ void block_sum(const float *x, float *out, int n)
{
    __shared__ float part[256];
    float s = 0.0f;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        s += x[i];
    part[threadIdx.x] = s;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w /= 2) {
        if (threadIdx.x < w)
            part[threadIdx.x] += part[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0)
        atomicAdd(out, part[0]);
}
