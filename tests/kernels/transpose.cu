// Matrix transpose through a padded 32 x 33 shared tile (no bank conflicts); block (32, 8).
#define TD 32
#define ROWS 8
extern "C" __global__ void transpose(const float* in, float* out, int width, int height) {
    __shared__ float tile[TD][TD + 1];
    int x = blockIdx.x * TD + threadIdx.x;
    int y = blockIdx.y * TD + threadIdx.y;
    for (int j = 0; j < TD; j += ROWS)
        if (x < width && y + j < height) tile[threadIdx.y + j][threadIdx.x] = in[(y + j) * width + x];
    __syncthreads();
    x = blockIdx.y * TD + threadIdx.x;
    y = blockIdx.x * TD + threadIdx.y;
    for (int j = 0; j < TD; j += ROWS)
        if (x < height && y + j < width) out[(y + j) * height + x] = tile[threadIdx.x][threadIdx.y + j];
}
