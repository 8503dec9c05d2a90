"""The guest's PTX JIT: PTX text -> a code object in the device's ISA (spec/isa.md).

    from pvgpu.guest.jit import compile_ptx, read_code_object, disassemble
    obj_bytes = compile_ptx(open("kernel.ptx").read())
    obj = read_code_object(obj_bytes)
    obj.entry("vector_add").params      # the parameter layout, for marshalling
    print(disassemble(obj))

Parts: `ptx` (lexer, parser, AST), `compiler` (layout, inlining, entries), `lower`
(instruction selection), `emit` (operand legalization, registers, labels), `codeobject`
(builder, reader, disassembler), `verify` (structural checks of the ISA rules).
"""

from pvgpu.guest.jit.codeobject import (CodeObject, CodeObjectBuilder, CodeObjectError, EntryInfo,
                                  ParamInfo, SymbolInfo, disassemble, read_code_object)
from pvgpu.guest.jit.compiler import compile_ptx
from pvgpu.guest.jit.errors import PtxCompileError, PtxError, PtxSyntaxError, PtxUnsupportedError

__all__ = ["compile_ptx", "read_code_object", "disassemble", "CodeObject", "CodeObjectBuilder",
           "CodeObjectError", "EntryInfo", "ParamInfo", "SymbolInfo", "PtxError",
           "PtxSyntaxError", "PtxUnsupportedError", "PtxCompileError"]
