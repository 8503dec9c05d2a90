"""The compute hardware's kernel ABI, shared by the user-mode driver and the hardware.

The built-in kernel library (spec/pvgpu.md §8): each kernel's id, name and argument
kinds, the element type its pointer arguments point at, which of them it writes, and the
access bits the MMU reports in a page fault. The hardware (host/hw) executes kernels by
this table and reports faults with these bits; the guest's user-mode driver packs launch
arguments by it. pvgpu.spec.wire re-exports these names, since LAUNCH's kernel ids and a page
fault's `access` travel on the wire, but the hardware imports them from here and knows
nothing of the guest protocol.
"""

from __future__ import annotations

from dataclasses import dataclass

# Access kinds of a memory access: an MMU fault reports them (RESP_ERR_PAGE_FAULT info1,
# the event queue's `access`).
ACCESS_READ = 1
ACCESS_WRITE = 2
ACCESS_EXEC = 4
ACCESS_NAMES = {ACCESS_READ: "read", ACCESS_WRITE: "write", ACCESS_EXEC: "exec"}

# Argument kinds of built-in kernels; each argument occupies one le64 slot.
ARG_PTR = "ptr"  # a GPU virtual address
ARG_U32 = "u32"  # low 32 bits of the slot
ARG_F32 = "f32"  # IEEE binary32 in the low 32 bits of the slot
# Element types a pointer argument points at (numpy dtype names, little-endian).
ELEM_F32 = "float32"  # IEEE binary32, 4 bytes


@dataclass(frozen=True)
class KernelSignature:
    kernel_id: int
    name: str
    args: tuple  # of (name, kind)
    elem_types: tuple = ()  # of (name, ELEM_*): the element type of each ARG_PTR argument

    def __post_init__(self):
        ptrs = sorted(n for n, kind in self.args if kind == ARG_PTR)
        if sorted(n for n, _ in self.elem_types) != ptrs:
            raise ValueError(f"{self.name}: every pointer argument needs one element type")

    def elem_type(self, arg: str) -> str | None:
        """The element type pointer argument `arg` points at (None for other arguments)."""
        return dict(self.elem_types).get(arg)


def _kernel(kernel_id: int, name: str, args: tuple, elem: str = ELEM_F32) -> KernelSignature:
    """A signature whose pointer arguments all point at `elem` elements."""
    return KernelSignature(kernel_id, name, args,
                           tuple((n, elem) for n, kind in args if kind == ARG_PTR))


KERNEL_FILL = 1
KERNEL_VECTOR_ADD = 2
KERNEL_SAXPY = 3
KERNEL_SCALE = 4
KERNEL_REDUCE_SUM = 5
KERNEL_GEMM = 6
KERNEL_RELU = 7
KERNEL_SOFTMAX = 8
KERNEL_BURN = 9

BUILTIN_KERNELS = {k.kernel_id: k for k in (
    _kernel(KERNEL_FILL, "fill", (("dst", ARG_PTR), ("value", ARG_F32), ("n", ARG_U32))),
    _kernel(KERNEL_VECTOR_ADD, "vector_add",
            (("a", ARG_PTR), ("b", ARG_PTR), ("c", ARG_PTR), ("n", ARG_U32))),
    _kernel(KERNEL_SAXPY, "saxpy",
            (("alpha", ARG_F32), ("x", ARG_PTR), ("y", ARG_PTR), ("n", ARG_U32))),
    _kernel(KERNEL_SCALE, "scale",
            (("dst", ARG_PTR), ("src", ARG_PTR), ("alpha", ARG_F32), ("n", ARG_U32))),
    _kernel(KERNEL_REDUCE_SUM, "reduce_sum", (("src", ARG_PTR), ("dst", ARG_PTR), ("n", ARG_U32))),
    _kernel(KERNEL_GEMM, "gemm",
            (("a", ARG_PTR), ("b", ARG_PTR), ("c", ARG_PTR),
             ("m", ARG_U32), ("n", ARG_U32), ("k", ARG_U32))),
    _kernel(KERNEL_RELU, "relu", (("dst", ARG_PTR), ("src", ARG_PTR), ("n", ARG_U32))),
    _kernel(KERNEL_SOFTMAX, "softmax",
            (("dst", ARG_PTR), ("src", ARG_PTR), ("rows", ARG_U32), ("cols", ARG_U32))),
    _kernel(KERNEL_BURN, "burn", (("microseconds", ARG_U32),)),
)}
KERNELS_BY_NAME = {k.name: k for k in BUILTIN_KERNELS.values()}
# The pointer arguments a built-in kernel writes (the others it only reads): implicit
# synchronisation of shared buffers orders writers and readers by them (spec §12.4).
KERNEL_WRITTEN_ARGS = frozenset({"dst", "c", "y"})
BURN_FOREVER = 0xFFFFFFFF  # burn(microseconds=BURN_FOREVER) runs until the engine is reset
