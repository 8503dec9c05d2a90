// A templated kernel instantiated for three types (C++-mangled entry names).
template <typename T>
__global__ void scale_add(T* data, T factor, T bias, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) data[i] = data[i] * factor + bias;
}
template __global__ void scale_add<float>(float*, float, float, int);
template __global__ void scale_add<double>(double*, double, double, int);
template __global__ void scale_add<int>(int*, int, int, int);
