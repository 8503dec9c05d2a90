"""Launches of the hardware's built-in kernels (CMD_LAUNCH): the kernel by name or id, its
arguments checked and encoded against its signature (guest/api/operands.py), grid and
block as dim3. A launch is asynchronous: it returns once submitted, and its error surfaces
at the stream's next synchronizing call, as in CUDA. Kernels of one's own (PTX, CUDA C,
code objects) are launched through guest/api/module.py.

Each argument is checked against the kernel's signature (spec [KRN-ARGS-2]): a
DeviceArray passed for a pointer argument must have the element type the signature gives
it (float32 for every built-in kernel) and belong to the launching context; a bare device
address (an int) carries no type and is passed as is.
"""

from __future__ import annotations

import struct

import numpy as np

from guest.api import errors
from guest.api.array import DeviceArray
from guest.api.commands import ring_command
from spec import wire

_F32 = struct.Struct("<f")
_SLOT = struct.Struct("<Q")


def builtin(ctx, s, kernel, grid, block, args) -> None:
    """Launch built-in `kernel` (a name or a kernel id) in context `ctx` on stream `s`."""
    sig = wire.KERNELS_BY_NAME.get(kernel) if isinstance(kernel, str) else wire.BUILTIN_KERNELS.get(kernel)
    if sig is None:
        raise errors.InvalidKernelError(
            f"no built-in kernel {kernel!r}; available: {', '.join(sorted(wire.KERNELS_BY_NAME))}",
            code=wire.RESP_ERR_INVALID_KERNEL)
    if len(args) != len(sig.args):
        raise TypeError(f"{sig.name}({', '.join(n for n, _ in sig.args)}) takes "
                        f"{len(sig.args)} arguments, got {len(args)}")
    slots = b"".join(kernel_argument(ctx, sig, name, kind, value)
                     for (name, kind), value in zip(sig.args, args))
    g, b = dim3(grid), dim3(block)
    s._raise_async_error()
    req = ctx._driver.submit(ring_command(wire.CMD_LAUNCH, (sig.kernel_id, *g, *b, len(args)),
                                          ctx_id=ctx.ctx_id, ring_idx=s.ring_idx, extra=slots))
    req.on_done = s._async_done


def kernel_argument(ctx, sig: wire.KernelSignature, name: str, kind: str, value) -> bytes:
    """The le64 slot of argument `name` of a launch of `sig` in `ctx` (spec [KRN-ARGS-1])."""
    kernel = sig.name
    if kind == wire.ARG_PTR:
        if isinstance(value, DeviceArray):
            value._check_usable()
            want = np.dtype(sig.elem_type(name)).newbyteorder("<")
            if value.dtype != want:
                raise TypeError(f"{kernel}: argument {name!r} must point at {want.name} elements, "
                                f"not at the {value.dtype} elements of {value!r}")
            if value.context is not ctx:
                raise ValueError(f"{kernel}: argument {name!r} ({value!r}) belongs to context "
                                 f"{value.context.ctx_id}, the launch runs in context {ctx.ctx_id} "
                                 "(device addresses are per context)")
            return _SLOT.pack(value.ptr)
        if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)) \
                and 0 <= int(value) < 1 << 64:
            return _SLOT.pack(int(value))
        raise TypeError(f"{kernel}: argument {name!r} must be a DeviceArray or a device address")
    if kind == wire.ARG_U32:
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) \
                or not 0 <= int(value) < 1 << 32:
            raise TypeError(f"{kernel}: argument {name!r} must be an int in [0, 2**32)")
        return _SLOT.pack(int(value))
    if kind == wire.ARG_F32:
        return _F32.pack(float(value)) + b"\0\0\0\0"
    raise AssertionError(kind)


def dim3(v) -> tuple:
    """A grid or block size (an int or up to three ints) as (x, y, z)."""
    if np.isscalar(v):
        v = (int(v),)
    v = tuple(int(x) for x in v) + (1, 1, 1)
    return v[:3]
