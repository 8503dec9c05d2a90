"""Where each PTX instruction is defined in NVIDIA's PTX ISA manual (chapter "Instruction
Set", by section title), so that an error about an instruction can point at its section."""

from __future__ import annotations

_GROUPS = {
    "Integer Arithmetic Instructions": (
        "mul24 mad24 sad popc clz bfind fns brev bfe bfi szext bmsk dp4a dp2a"),
    "Extended-Precision Integer Arithmetic Instructions": "addc subc madc",
    "Floating-Point Instructions": (
        "testp copysign fma rcp sqrt rsqrt sin cos lg2 ex2 tanh"),
    "Comparison and Selection Instructions": "set setp selp slct",
    "Logic and Shift Instructions": "and or xor not cnot lop3 shf shl shr",
    "Data Movement and Conversion Instructions": (
        "mov shfl prmt ld ldu st st.async st.bulk multimem prefetch prefetchu applypriority "
        "discard createpolicy isspacep cvta cvt cvt.pack mapa getctarank cp.async "
        "cp.async.bulk cp.reduce.async.bulk cp.async.bulk.tensor tensormap.replace "
        "ldmatrix stmatrix movmatrix"),
    "Texture Instructions": "tex tld4 txq istypep",
    "Surface Instructions": "suld sust sured suq",
    "Control Flow Instructions": "bra brx call ret exit",
    "Parallel Synchronization and Communication Instructions": (
        "bar barrier membar fence atom red red.async vote match activemask redux elect "
        "mbarrier griddepcontrol clusterlaunchcontrol"),
    "Warp Level Matrix Multiply-Accumulate Instructions": "wmma mma",
    "Asynchronous Warpgroup Level Matrix Multiply-Accumulate Instructions": "wgmma",
    "TensorCore 5th Generation Family Instructions": "tcgen05",
    "Stack Manipulation Instructions": "stacksave stackrestore alloca",
    "Video Instructions": (
        "vadd vsub vabsdiff vmin vmax vshl vshr vmad vset vadd2 vsub2 vavrg2 vabsdiff2 vmin2 "
        "vmax2 vset2 vadd4 vsub4 vavrg4 vabsdiff4 vmin4 vmax4 vset4"),
    "Miscellaneous Instructions": "brkpt nanosleep pmevent trap setmaxnreg",
}
_ARITH_SHARED = "add sub mul mad div rem abs neg min max"
_INSTRUCTIONS = {name: group for group, names in _GROUPS.items() for name in names.split()}


def section(opcode: str, mods: tuple = ()) -> str:
    """The manual section of an instruction, e.g. "Instruction Set › Texture Instructions ›
    tex". Integer and float forms of add, mul, ... are told apart by their type."""
    if opcode in ("add", "sub", "mad") and "cc" in mods:
        group = "Extended-Precision Integer Arithmetic Instructions"
    elif opcode in _ARITH_SHARED.split():
        if any(m in ("f16", "f16x2", "bf16", "bf16x2") for m in mods):
            group = "Half Precision Floating-Point Instructions"
        elif any(m in ("f32", "f64") for m in mods):
            group = "Floating-Point Instructions"
        else:
            group = "Integer Arithmetic Instructions"
    else:
        group = _INSTRUCTIONS.get(opcode)
        if group is None:
            return f"Instruction Set (no instruction named {opcode})"
    return f"Instruction Set › {group} › {opcode}"


SPECIAL_REGISTERS = "Special Registers"

