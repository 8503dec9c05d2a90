// A struct passed by value: an affine map applied to 2-D points.
struct Affine {
    float m[2][2];
    float shift[2];
    int count;
    unsigned char flip;
};
extern "C" __global__ void struct_param(Affine t, const float2* pts, float2* out) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= t.count) return;
    float2 p = pts[i];
    float2 r;
    r.x = t.m[0][0] * p.x + t.m[0][1] * p.y + t.shift[0];
    r.y = t.m[1][0] * p.x + t.m[1][1] * p.y + t.shift[1];
    if (t.flip) { float s = r.x; r.x = r.y; r.y = s; }
    out[i] = r;
}
