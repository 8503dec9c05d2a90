// Conversions: narrow integer loads and stores, float <-> int with every rounding mode,
// float <-> double, and signed/unsigned widening.
extern "C" __global__ void type_convert(const signed char* s8, const unsigned short* u16,
                                        const float* f, int* iout, float* fout, double* dout,
                                        unsigned char* u8out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float v = f[i];
    int* o = iout + 8 * i;
    o[0] = s8[i];
    o[1] = u16[i];
    o[2] = __float2int_rn(v);
    o[3] = __float2int_rz(v);
    o[4] = __float2int_rd(v);
    o[5] = __float2int_ru(v);
    o[6] = (int)__float2uint_rn(fabsf(v));
    o[7] = (int)(long long)(v * 1e6f);
    fout[2 * i] = (float)s8[i] * 0.5f + (float)u16[i];
    fout[2 * i + 1] = __int2float_rn(o[2] * 3) + __uint2float_rz(0xfffffff0u - (unsigned)i);
    dout[i] = (double)v * 1.0000001 + (double)(unsigned long long)u16[i];
    u8out[i] = (unsigned char)(s8[i] + 3);
}
