// Mandelbrot iteration counts: a divergent float loop per pixel.
extern "C" __global__ void mandelbrot(int* out, int w, int h, int max_iter) {
    int px = blockIdx.x * blockDim.x + threadIdx.x;
    int py = blockIdx.y * blockDim.y + threadIdx.y;
    if (px >= w || py >= h) return;
    float cr = -2.0f + 2.5f * px / w, ci = -1.25f + 2.5f * py / h;
    float zr = 0.0f, zi = 0.0f;
    int it = 0;
    while (it < max_iter && zr * zr + zi * zi <= 4.0f) {
        float t = zr * zr - zi * zi + cr;
        zi = 2.0f * zr * zi + ci;
        zr = t;
        ++it;
    }
    out[py * w + px] = it;
}
