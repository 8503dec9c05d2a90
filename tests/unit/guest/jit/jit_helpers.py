"""Helpers for the JIT tests: wrap PTX snippets in a module, compile, disassemble; load
the kernel manifest (tests/kernels/manifest.py)."""

import importlib.util
import sys
from pathlib import Path

from pvgpu.guest.jit import compile_ptx, read_code_object
from pvgpu.guest.jit.codeobject import format_instruction
from pvgpu.guest.jit.verify import verify

HEAD = ".version 8.0\n.target sm_80\n.address_size 64\n"


def module(text: str) -> str:
    return HEAD + text


def kernel(body: str, params: str = "", pre: str = "", regs: str = "") -> str:
    # R32: %r -> r0..r15, %f -> r16..r31, %rs -> r32..r39; R64: %rd -> rd0..rd15,
    # %fd -> rd16..rd23; scratch registers start at r40 and rd24.
    regs = regs or (".reg .b32 %r<16>;\n.reg .f32 %f<16>;\n.reg .b16 %rs<8>;\n"
                    ".reg .b64 %rd<16>;\n.reg .f64 %fd<8>;\n.reg .pred %p<8>;\n")
    return module(pre + f".visible .entry k({params})\n{{\n{regs}{body}\n}}\n")


def build(text: str):
    obj = verify(compile_ptx(text))
    return obj


def listing(text: str, entry: str = "k") -> list:
    """The instructions of one entry as text, without indices."""
    obj = build(text)
    e = obj.entry(entry)
    return [format_instruction(r) for r in obj.entry_code(e)]


def reread(blob: bytes):
    return read_code_object(blob)


KERNELS = Path(__file__).resolve().parents[3] / "kernels"


def load_manifest():
    """tests/kernels/manifest.py, imported by path (the tests are not a package)."""
    name = "pvgpu_kernel_manifest"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, KERNELS / "manifest.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]
