"""What a pvgpu device tells a CUDA program about itself: cuDeviceGetAttribute /
cudaDeviceGetAttribute values and cudaGetDeviceProperties, from spec/isa.py's numbers (the
execution model of an sm_80-like device: SM_COUNT, CLOCK_RATE_KHZ, block and shared-memory
limits), the device's VRAM, and the memory model of the session (mapped and managed host
memory exist only in the shared model, spec/pvgpu.md [MEM-WINDOW-5]).

A valid attribute pvgpu does not model (textures, surfaces, clusters, ...) reads 0: the
capability is absent. The runtime's cudaDeviceAttr values are the driver's
CUdevice_attribute values, so one table serves both.
"""

from __future__ import annotations

from pvgpu.cuda import enums
from pvgpu.cuda.handles import cudaDeviceProp
from pvgpu.spec import isa, wire

COMPUTE_CAPABILITY = (8, 0)
STATIC_SHARED_PER_BLOCK = isa.MAX_SHARED_SIZE
MAX_GRID = wire.MAX_GRID_DIM - 1
TOTAL_CONST_MEM = 64 << 10
REGS_PER_BLOCK = 64 << 10
MAX_THREADS_PER_SM = 2048
MAX_BLOCKS_PER_SM = 32
COPY_ENGINES = 2

_A = "CU_DEVICE_ATTRIBUTE_"


def _table(info: dict) -> dict:
    """{attribute name without the CU_DEVICE_ATTRIBUTE_ prefix: value}."""
    mapped = int(info["mappable"])
    return {
        "MAX_THREADS_PER_BLOCK": isa.MAX_BLOCK_THREADS,
        "MAX_BLOCK_DIM_X": isa.MAX_BLOCK_THREADS,
        "MAX_BLOCK_DIM_Y": isa.MAX_BLOCK_THREADS,
        "MAX_BLOCK_DIM_Z": isa.MAX_BLOCK_THREADS,
        "MAX_GRID_DIM_X": MAX_GRID,
        "MAX_GRID_DIM_Y": MAX_GRID,
        "MAX_GRID_DIM_Z": MAX_GRID,
        "MAX_SHARED_MEMORY_PER_BLOCK": STATIC_SHARED_PER_BLOCK,
        "MAX_SHARED_MEMORY_PER_BLOCK_OPTIN": isa.MAX_DYNAMIC_SHARED,
        "MAX_SHARED_MEMORY_PER_MULTIPROCESSOR": isa.MAX_DYNAMIC_SHARED,
        "TOTAL_CONSTANT_MEMORY": TOTAL_CONST_MEM,
        "WARP_SIZE": isa.WARP_SIZE,
        "MAX_PITCH": MAX_GRID,
        "MAX_REGISTERS_PER_BLOCK": REGS_PER_BLOCK,
        "MAX_REGISTERS_PER_MULTIPROCESSOR": REGS_PER_BLOCK,
        "CLOCK_RATE": isa.CLOCK_RATE_KHZ,
        "GPU_OVERLAP": 1,
        "MULTIPROCESSOR_COUNT": isa.SM_COUNT,
        "INTEGRATED": 0,
        "CAN_MAP_HOST_MEMORY": mapped,
        "COMPUTE_MODE": 0,  # CU_COMPUTEMODE_DEFAULT
        "CONCURRENT_KERNELS": 1,
        "PCI_BUS_ID": info["index"],
        "ASYNC_ENGINE_COUNT": COPY_ENGINES,
        "UNIFIED_ADDRESSING": 1,
        "MAX_THREADS_PER_MULTIPROCESSOR": MAX_THREADS_PER_SM,
        "MAX_BLOCKS_PER_MULTIPROCESSOR": MAX_BLOCKS_PER_SM,
        "COMPUTE_CAPABILITY_MAJOR": COMPUTE_CAPABILITY[0],
        "COMPUTE_CAPABILITY_MINOR": COMPUTE_CAPABILITY[1],
        "MANAGED_MEMORY": mapped,
        "CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM": 0,
        "PAGEABLE_MEMORY_ACCESS": 0,
        "CONCURRENT_MANAGED_ACCESS": 0,
    }


def attributes(info: dict) -> dict:
    """{CUdevice_attribute value: int} for every attribute of the enumeration. `info`:
    index, name, vram (bytes) and mappable (the session's memory model is shared)."""
    known = _table(info)
    out = {}
    for m in enums.CUdevice_attribute:
        if m.name == _A + "MAX":  # the enumeration's end marker
            continue
        name = m.name[len(_A):] if m.name.startswith(_A) else m.name
        out[int(m)] = int(known.get(name, 0))
    return out


def get(info: dict, attrib) -> int:
    """One attribute (a CUdevice_attribute or cudaDeviceAttr, or its value); KeyError for a
    value that is neither."""
    return attributes(info)[int(attrib)]


def properties(info: dict) -> cudaDeviceProp:
    """cudaGetDeviceProperties of the device `info` describes."""
    t = _table(info)
    fields = dict.fromkeys(PROPERTY_FIELDS, 0)
    fields.update(
        name=info["name"].encode()[:255],
        uuid=bytes(16),
        luid=bytes(8),
        totalGlobalMem=info["vram"],
        sharedMemPerBlock=t["MAX_SHARED_MEMORY_PER_BLOCK"],
        sharedMemPerBlockOptin=t["MAX_SHARED_MEMORY_PER_BLOCK_OPTIN"],
        sharedMemPerMultiprocessor=t["MAX_SHARED_MEMORY_PER_MULTIPROCESSOR"],
        regsPerBlock=t["MAX_REGISTERS_PER_BLOCK"],
        regsPerMultiprocessor=t["MAX_REGISTERS_PER_MULTIPROCESSOR"],
        warpSize=t["WARP_SIZE"],
        memPitch=t["MAX_PITCH"],
        maxThreadsPerBlock=t["MAX_THREADS_PER_BLOCK"],
        maxThreadsDim=[t["MAX_BLOCK_DIM_X"], t["MAX_BLOCK_DIM_Y"], t["MAX_BLOCK_DIM_Z"]],
        maxGridSize=[t["MAX_GRID_DIM_X"], t["MAX_GRID_DIM_Y"], t["MAX_GRID_DIM_Z"]],
        clockRate=t["CLOCK_RATE"],
        totalConstMem=t["TOTAL_CONSTANT_MEMORY"],
        major=t["COMPUTE_CAPABILITY_MAJOR"],
        minor=t["COMPUTE_CAPABILITY_MINOR"],
        multiProcessorCount=t["MULTIPROCESSOR_COUNT"],
        integrated=t["INTEGRATED"],
        canMapHostMemory=t["CAN_MAP_HOST_MEMORY"],
        computeMode=t["COMPUTE_MODE"],
        concurrentKernels=t["CONCURRENT_KERNELS"],
        deviceOverlap=t["GPU_OVERLAP"],
        pciBusID=t["PCI_BUS_ID"],
        asyncEngineCount=t["ASYNC_ENGINE_COUNT"],
        unifiedAddressing=t["UNIFIED_ADDRESSING"],
        maxThreadsPerMultiProcessor=t["MAX_THREADS_PER_MULTIPROCESSOR"],
        maxBlocksPerMultiProcessor=t["MAX_BLOCKS_PER_MULTIPROCESSOR"],
        managedMemory=t["MANAGED_MEMORY"],
        pageableMemoryAccess=t["PAGEABLE_MEMORY_ACCESS"],
        concurrentManagedAccess=t["CONCURRENT_MANAGED_ACCESS"],
    )
    return cudaDeviceProp(**fields)


# the fields of CUDA 13's cudaDeviceProp, and those of CUDA 12 that 13 dropped (programs
# written for 12 read them: clockRate above all)
PROPERTY_FIELDS = (
    "clockRate", "memoryClockRate", "kernelExecTimeoutEnabled", "deviceOverlap",
    "ECCEnabled", "accessPolicyMaxWindowSize", "asyncEngineCount", "canMapHostMemory",
    "canUseHostPointerForRegisteredMem", "clusterLaunch", "computeMode",
    "computePreemptionSupported", "concurrentKernels", "concurrentManagedAccess",
    "cooperativeLaunch", "deferredMappingCudaArraySupported", "deviceNumaConfig",
    "deviceNumaId", "directManagedMemAccessFromHost", "globalL1CacheSupported",
    "gpuDirectRDMAFlushWritesOptions", "gpuDirectRDMASupported", "gpuDirectRDMAWritesOrdering",
    "gpuPciDeviceID", "gpuPciSubsystemID", "hostNativeAtomicSupported", "hostNumaId",
    "hostNumaMultinodeIpcSupported", "hostRegisterReadOnlySupported", "hostRegisterSupported",
    "integrated", "ipcEventSupported", "isMultiGpuBoard", "l2CacheSize", "localL1CacheSupported",
    "luid", "luidDeviceNodeMask", "major", "managedMemory", "maxBlocksPerMultiProcessor",
    "maxGridSize", "maxThreadsDim", "maxThreadsPerBlock", "maxThreadsPerMultiProcessor",
    "memPitch", "memoryBusWidth", "memoryPoolSupportedHandleTypes", "memoryPoolsSupported",
    "minor", "mpsEnabled", "multiGpuBoardGroupID", "multiProcessorCount", "name",
    "pageableMemoryAccess", "pageableMemoryAccessUsesHostPageTables", "pciBusID", "pciDeviceID",
    "pciDomainID", "persistingL2CacheMaxSize", "regsPerBlock", "regsPerMultiprocessor",
    "reservedSharedMemPerBlock", "sharedMemPerBlock", "sharedMemPerBlockOptin",
    "sharedMemPerMultiprocessor", "sparseCudaArraySupported", "streamPrioritiesSupported",
    "surfaceAlignment", "tccDriver", "textureAlignment", "texturePitchAlignment",
    "timelineSemaphoreInteropSupported", "totalConstMem", "totalGlobalMem", "unifiedAddressing",
    "unifiedFunctionPointers", "uuid", "warpSize",
)
