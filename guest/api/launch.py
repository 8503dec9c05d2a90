"""Launches of the hardware's built-in kernels (CMD_LAUNCH): the kernel by name or id, its
arguments checked and encoded against its signature (guest/api/operands.py), grid and
block as dim3. A launch is asynchronous: it returns once recorded in the driver's open LAUNCH_BATCH
(guest/frontend/launch_batch.py: one request for a run of launches of one stream), or, on
a device without PVGPU_F_LAUNCH_BATCH, once submitted as a LAUNCH whose kick is deferred
(the driver's kick policy, guest/frontend/driver.py); its error surfaces at the stream's
next synchronizing call, as in CUDA. Kernels of
one's own (PTX, CUDA C, code objects) are launched through guest/api/module.py.

Each argument is checked against the kernel's signature (spec [KRN-ARGS-2]): a
DeviceArray passed for a pointer argument must have the element type the signature gives
it (float32 for every built-in kernel) and belong to the launching context; a bare device
address (an int) carries no type and is passed as is.
"""

from __future__ import annotations

import struct

import numpy as np

from pvgpu.guest.api import errors
from pvgpu.guest.api.array import DeviceArray
from pvgpu.spec import wire

_F32 = struct.Struct("<f")


class _Plan:
    """How a launch of one built-in kernel is encoded: one struct for the whole command
    (header, LAUNCH body, one le64 slot per argument), one for its record in a
    LAUNCH_BATCH (the same without the header) and, per argument, its name, kind and the
    element type a pointer argument must have. Made once per kernel."""

    __slots__ = ("sig", "cmd", "record", "args", "nargs")

    def __init__(self, sig: wire.KernelSignature):
        self.sig = sig
        slots = "".join("f4x" if kind == wire.ARG_F32 else "Q" for _, kind in sig.args)
        self.cmd = struct.Struct(wire.CTRL_HDR_FORMAT
                                 + wire.CMD_BODY_FORMATS[wire.CMD_LAUNCH].lstrip("<") + slots)
        self.record = struct.Struct(wire.LAUNCH_RECORD_FORMAT + slots)
        self.args = tuple(
            (name, kind, np.dtype(sig.elem_type(name)).newbyteorder("<")
             if kind == wire.ARG_PTR else None)
            for name, kind in sig.args)
        self.nargs = len(self.args)


# by kernel name and by kernel id
_PLANS = {key: _Plan(sig) for sig in wire.BUILTIN_KERNELS.values()
          for key in (sig.name, sig.kernel_id)}


def builtin(ctx, s, kernel, grid, block, args) -> None:
    """Launch built-in `kernel` (a name or a kernel id) in context `ctx` on stream `s`."""
    plan = _PLANS.get(kernel)  # names are str keys, ids int keys: as the two tables
    if plan is None:
        raise errors.InvalidKernelError(
            f"no built-in kernel {kernel!r}; available: {', '.join(sorted(wire.KERNELS_BY_NAME))}",
            code=wire.RESP_ERR_INVALID_KERNEL)
    sig = plan.sig
    if len(args) != plan.nargs:
        raise TypeError(f"{sig.name}({', '.join(n for n, _ in sig.args)}) takes "
                        f"{len(sig.args)} arguments, got {len(args)}")
    values = [argument_value(ctx, sig.name, name, kind, want, value)
              for (name, kind, want), value in zip(plan.args, args)]
    g = (grid, 1, 1) if type(grid) is int else dim3(grid)
    b = (block, 1, 1) if type(block) is int else dim3(block)
    if s._async_error is not None:
        s._raise_async_error()
    ring_idx = s.ring_idx
    driver = ctx._driver
    if driver.batcher is not None:  # one LAUNCH_BATCH for a run of launches (spec §6.5.33)
        driver.launch(ctx.ctx_id, ring_idx, plan.record,
                      (sig.kernel_id, *g, *b, len(values), *values), s._async_done)
        return
    cmd = plan.cmd.pack(wire.CMD_LAUNCH, wire.FLAG_INFO_RING_IDX if ring_idx else 0, 0,
                        ctx.ctx_id, ring_idx, sig.kernel_id, *g, *b, len(values), *values)
    req = driver.submit(cmd, kick=False)
    req.on_done = s._async_done


def argument_value(ctx, kernel: str, name: str, kind: str, want, value):
    """The value of argument `name` (of `kind`; a pointer to `want` elements) of a launch
    of `kernel` in `ctx`, checked, as its le64 slot holds it (spec [KRN-ARGS-1])."""
    if kind == wire.ARG_PTR:
        if isinstance(value, DeviceArray):
            value._check_usable()
            if value.dtype != want:
                raise TypeError(f"{kernel}: argument {name!r} must point at {want.name} elements, "
                                f"not at the {value.dtype} elements of {value!r}")
            if value.context is not ctx:
                raise ValueError(f"{kernel}: argument {name!r} ({value!r}) belongs to context "
                                 f"{value.context.ctx_id}, the launch runs in context {ctx.ctx_id} "
                                 "(device addresses are per context)")
            return value.ptr
        if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)) \
                and 0 <= int(value) < 1 << 64:
            return int(value)
        raise TypeError(f"{kernel}: argument {name!r} must be a DeviceArray or a device address")
    if kind == wire.ARG_U32:
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) \
                or not 0 <= int(value) < 1 << 32:
            raise TypeError(f"{kernel}: argument {name!r} must be an int in [0, 2**32)")
        return int(value)
    if kind == wire.ARG_F32:
        value = float(value)
        try:
            _F32.pack(value)  # now, before the stream's pending error is raised
        except OverflowError:
            raise errors.OutOfRangeError(f"{kernel}: argument {name!r}: {value} is out of "
                                         "the range of float32") from None
        return value
    raise AssertionError(kind)


def dim3(v) -> tuple:
    """A grid or block size (an int or up to three ints) as (x, y, z)."""
    if type(v) is int:
        return v, 1, 1
    if np.isscalar(v):
        v = (v,)
    v = tuple(int(x) for x in v) + (1, 1, 1)
    return v[:3]
