"""Device attributes and properties from spec/isa.py's numbers and the memory model."""

import pytest

from pvgpu.cuda import _attributes, enums
from pvgpu.spec import isa

A = enums.CUdevice_attribute
SHARED = {"index": 1, "name": "pvgpu-emu", "vram": 1 << 30, "mappable": True}
INLINE = dict(SHARED, mappable=False)


def test_every_attribute_has_a_value_and_the_modelled_ones_are_the_devices():
    table = _attributes.attributes(SHARED)
    assert set(table) == {int(m) for m in A} - {int(A.CU_DEVICE_ATTRIBUTE_MAX)}
    get = lambda a, info=SHARED: _attributes.get(info, a)  # noqa: E731
    assert get(A.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT) == isa.SM_COUNT
    assert get(A.CU_DEVICE_ATTRIBUTE_CLOCK_RATE) == isa.CLOCK_RATE_KHZ
    assert get(A.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN) == isa.MAX_DYNAMIC_SHARED
    assert get(A.CU_DEVICE_ATTRIBUTE_PCI_BUS_ID) == 1
    assert get(A.CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY) == 1
    assert get(A.CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY, INLINE) == 0
    assert get(A.CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY, INLINE) == 0
    assert get(A.CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM) == 0
    # the runtime's attributes are the driver's values
    R = enums.cudaDeviceAttr
    assert get(R.cudaDevAttrMultiProcessorCount) == isa.SM_COUNT
    assert get(R.cudaDevAttrComputeCapabilityMajor) == 8
    with pytest.raises(KeyError):
        get(A.CU_DEVICE_ATTRIBUTE_MAX)
    with pytest.raises(KeyError):
        get(99999)


def test_properties():
    # [MEM-WINDOW-5] canMapHostMemory and managedMemory are 0 in the inline model
    p = _attributes.properties(SHARED)
    assert set(vars(p)) == set(_attributes.PROPERTY_FIELDS)
    assert p.name == b"pvgpu-emu" and p.totalGlobalMem == 1 << 30
    assert (p.major, p.minor, p.multiProcessorCount, p.warpSize) == (8, 0, isa.SM_COUNT, 32)
    assert p.maxThreadsDim == [1024] * 3 and p.canMapHostMemory == p.managedMemory == 1
    q = _attributes.properties(INLINE)
    assert q.canMapHostMemory == q.managedMemory == 0 and q.unifiedAddressing == 1
    with pytest.raises(AttributeError):
        p.noSuchField
