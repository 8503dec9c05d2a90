"""CUDA's driver and runtime APIs over pvgpu, shaped like cuda-python (cuda-bindings 12/13):
a program written for `cuda.bindings.driver` / `cuda.bindings.runtime` runs on a pvgpu host
with only its imports changed:

    from pvgpu.cuda import driver as cuda      # was: from cuda.bindings import driver as cuda
    from pvgpu.cuda import runtime as cudart   # was: from cuda.bindings import runtime as cudart

A thin mapping onto the guest API (guest/api): contexts, streams, events, device memory,
pinned memory and modules are the guest API's; the facade adds CUDA's conventions (tuple
returns with error codes, handles, the current context, unified addressing, mapped and
managed host memory). Where things live:

  driver.py, runtime.py   the functions
  enums.py, handles.py    CUresult, cudaError_t, ... and CUdevice, CUdeviceptr, dim3, ...
  _state.py               the connection, contexts, the current context, address slots
  _memory.py              allocations, unified addressing, copies, memsets
  _launch.py              cuLaunchKernel's kernelParams and extra
  _attributes.py          device attributes and properties
  _errors.py              error codes
  helpers.py              stand-ins for the helpers of NVIDIA's cuda-python samples

The facade connects on first use (PVGPU_ENDPOINT, PVGPU_MEMORY, PVGPU_MEM_SIZE), or to what
`connect()` names; `shutdown()` ends the connection and forgets every handle.
`error_detail()` is the message behind the calling thread's last error code.
"""

from __future__ import annotations

from pvgpu.cuda import _errors, _state


def connect(endpoint: str | None = None, *, memory: str | None = None,
            mem_size: int | None = None) -> None:
    """Use (from now on) a new connection to the pvgpu host at `endpoint` (default: the
    local endpoint), with guest memory model `memory` ("shared" or "inline") and
    `mem_size` bytes of guest memory. Handles of an earlier connection become invalid.
    Raises guest.PvgpuError if the host cannot be reached."""
    _state.configure(endpoint, memory, mem_size)


def shutdown() -> None:
    """End the facade's connection (its contexts and memory go with it)."""
    _state.shutdown()


def error_detail() -> str:
    """Why the calling thread's last failing pvgpu.cuda call failed, in words."""
    return _errors.detail()
