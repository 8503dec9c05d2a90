// Compiled by NVRTC: system-scope atomics of every kind on one array (as a program that
// shares memory with the host would use them).
extern "C" __global__ void system_atomics(int* data, unsigned int* udata, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    atomicAdd_system(&data[0], 10);
    atomicExch_system(&data[1], i);
    atomicMax_system(&data[2], i);
    atomicMin_system(&data[3], i);
    atomicInc_system(&udata[0], 17u);
    atomicDec_system(&udata[1], 137u);
    atomicCAS_system(&data[4], i - 1, i);
    atomicAnd_system(&data[5], 2 * i + 7);
    atomicOr_system(&data[6], 1 << (i & 31));
    atomicXor_system(&data[7], i);
}
