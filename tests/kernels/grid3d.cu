// 3-D grid of 3-D blocks: every thread writes a code of its coordinates at its linear index.
extern "C" __global__ void grid3d(unsigned int* out, int nx, int ny, int nz) {
    int x = blockIdx.x * blockDim.x + threadIdx.x;
    int y = blockIdx.y * blockDim.y + threadIdx.y;
    int z = blockIdx.z * blockDim.z + threadIdx.z;
    if (x >= nx || y >= ny || z >= nz) return;
    unsigned int lin_tid = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    out[(z * ny + y) * nx + x] = (x << 20) ^ (y << 10) ^ z ^ (lin_tid << 24) ^ (gridDim.x * gridDim.y * gridDim.z);
}
