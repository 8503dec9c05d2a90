"""Launches of built-in kernels (guest/api/launch.py) encode exactly the LAUNCH command the
wire defines (spec [KRN-ARGS-1], CMD-HDR-1), whatever way the kernel, grid and block are
given; bad arguments are refused before anything is submitted."""

import struct
from types import SimpleNamespace

import numpy as np
import pytest

from pvgpu.guest.api import errors, launch
from pvgpu.spec import wire


class RecordingDriver:
    """Without PVGPU_F_LAUNCH_BATCH: each launch is a LAUNCH request."""

    batcher = None

    def __init__(self):
        self.commands = []

    def submit(self, command, readable=(), writable=(), kick=True):
        self.commands.append(bytes(command))
        return SimpleNamespace(on_done=None)


class BatchingDriver(RecordingDriver):
    """With it: each launch is a LAUNCH_BATCH record, kept here as a LAUNCH request would
    carry it (the batch's header + the record), so both encodings compare to one reference."""

    batcher = object()

    def launch(self, ctx_id, ring_idx, record, values, on_done):
        flags = wire.FLAG_INFO_RING_IDX if ring_idx else 0
        self.commands.append(struct.pack(wire.CTRL_HDR_FORMAT, wire.CMD_LAUNCH, flags, 0,
                                         ctx_id, ring_idx) + record.pack(*values))


def make(ctx_id=7, ring_idx=3, driver=RecordingDriver):
    ctx = SimpleNamespace(ctx_id=ctx_id, _driver=driver())
    stream = SimpleNamespace(ring_idx=ring_idx, _async_error=None, _async_done=lambda req: None,
                             _raise_async_error=lambda: None)
    return ctx, stream


def reference(sig, ctx_id, ring_idx, grid, block, args) -> bytes:
    """The command as spec §6 lays it out, built field by field."""
    slots = b""
    for (_name, kind), value in zip(sig.args, args):
        slots += struct.pack("<f", value) + bytes(4) if kind == wire.ARG_F32 else \
            struct.pack("<Q", value)
    flags = wire.FLAG_INFO_RING_IDX if ring_idx else 0
    return (struct.pack(wire.CTRL_HDR_FORMAT, wire.CMD_LAUNCH, flags, 0, ctx_id, ring_idx)
            + struct.pack(wire.CMD_BODY_FORMATS[wire.CMD_LAUNCH], sig.kernel_id, *grid, *block,
                          len(args))
            + slots)


def sample_args(sig):
    return tuple({wire.ARG_PTR: 0x1000 * (i + 1), wire.ARG_U32: 256 + i, wire.ARG_F32: 1.5 * i}[kind]
                 for i, (_n, kind) in enumerate(sig.args))


@pytest.mark.parametrize("sig", list(wire.BUILTIN_KERNELS.values()), ids=lambda s: s.name)
@pytest.mark.parametrize("ring_idx", [0, 5])
@pytest.mark.parametrize("driver", [RecordingDriver, BatchingDriver], ids=["launch", "batch"])
def test_every_builtin_kernel_encodes_its_launch_as_the_wire_defines(sig, ring_idx, driver):
    # [KRN-ARGS-1] [CMD-HDR-1] high halves of u32/f32 slots and pad are 0; no flag but INFO_RING_IDX
    # [CMD-LAUNCH-BATCH-1] a batch record is a LAUNCH body and its argument slots
    ctx, s = make(ring_idx=ring_idx, driver=driver)
    args = sample_args(sig)
    launch.builtin(ctx, s, sig.name, (4, 2), 128, args)
    launch.builtin(ctx, s, sig.kernel_id, np.int64(4), (128, 1, 1), args)
    want = [reference(sig, 7, ring_idx, (4, 2, 1), (128, 1, 1), args),
            reference(sig, 7, ring_idx, (4, 1, 1), (128, 1, 1), args)]
    assert ctx._driver.commands == want


@pytest.mark.parametrize("kernel", ["nope", 999, "1", None])
def test_an_unknown_kernel_is_refused_before_anything_is_submitted(kernel):
    ctx, s = make()
    with pytest.raises(errors.InvalidKernelError):
        launch.builtin(ctx, s, kernel, 1, 1, ())
    assert ctx._driver.commands == []


@pytest.mark.parametrize("args, error", [
    ((0x1000, 1.0), TypeError),  # too few
    ((0x1000, 1.0, -1), TypeError),  # u32 out of range
    ((0x1000, 1.0, True), TypeError),  # a bool is not a count
    ((-5, 1.0, 4), TypeError),  # not a device address
    ((0x1000, 1e300, 4), OverflowError),  # not a binary32
])
def test_bad_arguments_are_refused_before_anything_is_submitted(args, error):
    ctx, s = make()
    with pytest.raises(error):
        launch.builtin(ctx, s, "fill", 1, 256, args)
    assert ctx._driver.commands == []
