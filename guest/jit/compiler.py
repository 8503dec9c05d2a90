"""The PTX compiler: a parsed PTX module -> a code object (spec/isa.md).

Module layout: `.global` and `.const` variables are placed in the object's two segments
in declaration order, with their alignment and initial bytes, and named in its symbol
table (COBJ-SYMBOL-1). Each `.entry` becomes one entry record whose code is compiled on
its own:

- **Registers.** Every PTX register gets a register of its file (R32 for 8- to 32-bit
  types, R64 for 64-bit ones, PRED); registers declared in a `{ }` scope are reused after
  it. Scratch registers for the lowering come after all of them (guest/jit/emit.py).
- **Parameters.** Kernel parameters are laid out in declaration order, each at a multiple
  of its alignment (COBJ-PARAM-1); `ld.param` reads the parameter buffer.
- **Calls.** Every `.func` call is inlined: the callee's registers, labels and `.local`
  frame are placed after the caller's (siblings reuse them). A call's `.param` variables
  live in a register when every access is a whole scalar, else in the caller's local
  memory; the callee's parameter names are bound to the caller's variables, `ret` jumps
  to the end of the inlined body. Recursion and calls to functions without a body are
  refused.
- **Memory.** Static `.shared` variables the entry uses (module or function level) are
  laid out from 0; `.extern .shared` arrays (dynamic shared memory) all start at the
  aligned end of the static part, which is the entry's `shared_size`. `.local` variables
  (`__local_depot` frames) and the memory-resident `.param` variables of calls make up
  the entry's `local_size`.
- **Control.** Labels become instruction indices; `ret` in an entry is `exit`; an entry
  ends with `exit` unless its last instruction already ends every thread (ISA-VALID-5).
"""

from __future__ import annotations

import math
from typing import Union

from pvgpu.guest.jit.codeobject import CodeObjectBuilder, ParamInfo
from pvgpu.guest.jit.emit import Emitter
from pvgpu.guest.jit.errors import PtxCompileError, PtxSyntaxError, PtxUnsupportedError
from pvgpu.guest.jit.lower import Lowering, file_of, float_bits, ptx_bits
from pvgpu.guest.jit.names import (ExternVar, FrameInfo, ParamSlot, RegVar, Scope, SpaceVar,
                             VecRegVar)
from pvgpu.guest.jit.ptx import ast, parse
from pvgpu.guest.jit.sections import section
from pvgpu.spec import isa

_SPACE_OF = {"global": isa.SPACE_GLOBAL, "const": isa.SPACE_CONST,
             "shared": isa.SPACE_SHARED, "local": isa.SPACE_LOCAL}


def _align_up(x: int, a: int) -> int:
    return (x + a - 1) // a * a


def _flatten(init) -> list:
    if isinstance(init, list):
        out = []
        for x in init:
            out.extend(_flatten(x))
        return out
    return [init]


def var_elem_bytes(decl: ast.VarDecl) -> int:
    if decl.type not in isa.TYPES_BY_NAME or decl.type == "pred":
        raise PtxUnsupportedError(f"variables of type .{decl.type} are not supported",
                                  decl.line, decl.text,
                                  "State Spaces, Types, and Variables › Types")
    return ptx_bits(decl.type) // 8 * max(decl.vector, 1)


def var_size(decl: ast.VarDecl) -> int:
    """Bytes of a variable; an unsized `[]` takes its size from the initializer."""
    n = 1
    for i, d in enumerate(decl.dims):
        if d is None:
            if decl.init is None or i:
                return 0  # an extern/dynamic array
            inner = math.prod(x for x in decl.dims[1:] if x)
            count = len(_flatten(decl.init)) // max(decl.vector, 1)
            d = -(-count // max(inner, 1))
        n *= d
    return n * var_elem_bytes(decl)


def var_align(decl: ast.VarDecl) -> int:
    return decl.align or var_elem_bytes(decl)


def encode_init(decl: ast.VarDecl, size: int) -> bytes:
    """The initial bytes of a variable (zero beyond its initializer)."""
    t = isa.TYPES_BY_NAME[decl.type]
    width = isa.TYPE_BITS[t] // 8
    out = bytearray(size)
    items = _flatten(decl.init)
    if len(items) * width > size:
        raise PtxCompileError(f"too many initializers for {decl.name}", decl.line, decl.text)
    for i, v in enumerate(items):
        if isinstance(v, tuple):
            raise PtxUnsupportedError(
                f"the initializer of {decl.name} holds an address ({v[1]}); code objects "
                "have no relocations", decl.line, decl.text,
                "State Spaces, Types, and Variables › Variables › Initializers")
        if isinstance(v, ast.FImm):
            if t in isa.FLOAT_TYPES:
                bits = float_bits(-v.literal.value if v.negative else v.literal.value, t)
            elif v.literal.width == width * 8 and not v.negative:
                bits = v.literal.bits
            else:
                raise PtxCompileError(f"float initializer for .{decl.type} {decl.name}",
                                      decl.line, decl.text)
        else:
            if t in isa.FLOAT_TYPES and v != 0:
                raise PtxCompileError(f"integer initializer {v} for .{decl.type} {decl.name}",
                                      decl.line, decl.text)
            bits = v & ((1 << (8 * width)) - 1)
        out[i * width:(i + 1) * width] = bits.to_bytes(width, "little")
    return bytes(out)


def _walk(block: ast.Block):
    for st in block.stmts:
        if isinstance(st, ast.Block):
            yield from _walk(st)
        else:
            yield st


def _operand_names(op, out: set) -> None:
    if isinstance(op, ast.Sym):
        out.add(op.name)
    elif isinstance(op, ast.Addr) and isinstance(op.base, ast.Sym):
        out.add(op.base.name)
    elif isinstance(op, ast.Vec):
        for x in op.items:
            _operand_names(x, out)


def _references(block: ast.Block, name: str):
    """The statements of a block that name `name` (as a symbol, not a register)."""
    for st in _walk(block):
        if isinstance(st, ast.Instruction):
            names: set = set()
            for op in st.operands:
                _operand_names(op, names)
            if name in names:
                yield st
        elif isinstance(st, ast.Call):
            names = set()
            for op in list(st.args) + list(st.rets):
                _operand_names(op, names)
            if name in names:
                yield st


def _whole_param_access(st, name: str, bits: int) -> bool:
    """Is `st` an ld.param/st.param of all `bits` of scalar parameter `name` at offset 0?"""
    if not isinstance(st, ast.Instruction) or st.opcode not in ("ld", "st"):
        return False
    if "param" not in st.mods or any(m in ("v2", "v4") for m in st.mods):
        return False
    types = [m for m in st.mods if m in isa.TYPES_BY_NAME]
    if len(types) != 1 or ptx_bits(types[0]) != bits or len(st.operands) != 2:
        return False  # a malformed access is left for the lowering to refuse
    addr = st.operands[1] if st.opcode == "ld" else st.operands[0]
    if not (isinstance(addr, ast.Addr) and isinstance(addr.base, ast.Sym)
            and addr.base.name == name and not addr.base.offset and not addr.offset):
        return False
    others = st.operands[:1] if st.opcode == "ld" else st.operands[1:]
    names: set = set()
    for op in others:
        _operand_names(op, names)
    return name not in names


class EntryCompiler(Lowering):
    """Compiles one `.entry` (with every function it calls inlined)."""

    def __init__(self, mod: "ModuleCompiler", entry: ast.Function):
        self.mod = mod
        self.entry = entry
        self.em = Emitter()
        self.frame: FrameInfo = None
        self.scope: Scope = None
        self.stack: list = []
        self.local_top = mod.module_local_size
        self.local_max = self.local_top
        self.shared_size = 0
        self.dynamic_base = 0
        self.cc = None
        self.func_shared: dict = {}

    # ---------------------------------------------------------------- names
    def lookup(self, name: str):
        return self.scope.lookup(name)

    def slot_in_memory(self, slot: ParamSlot, ins) -> SpaceVar:
        if slot.reg is not None:
            raise AssertionError(f"line {ins.line}: parameter {slot.decl.name} is in a register")
        return SpaceVar(isa.SPACE_LOCAL, slot.offset, var_size(slot.decl), slot.decl)

    # ---------------------------------------------------------------- layout
    def layout_shared(self) -> Scope:
        """Place the static and dynamic shared variables the entry (and its callees) use."""
        funcs = self.mod.reachable(self.entry)
        used: set = set()
        for fn in funcs:
            used |= self.mod.names_used(fn)
        scope = Scope(self.mod.scope)
        top = 0
        dynamic = []
        for decl in self.mod.shared_vars:
            if decl.name not in used:
                continue
            if decl.linkage == "extern" or (decl.dims and decl.dims[0] is None):
                dynamic.append(decl)
                continue
            top = _align_up(top, var_align(decl))
            scope.bind(decl.name, SpaceVar(isa.SPACE_SHARED, top, var_size(decl), decl))
            top += var_size(decl)
        self.func_shared = {}
        for fn in funcs:
            for st in _walk(fn.body):
                if isinstance(st, ast.VarDecl) and st.space == "shared":
                    if st.dims and st.dims[0] is None:
                        dynamic.append(st)
                        self.func_shared[(fn.name, st.name)] = None
                        continue
                    top = _align_up(top, var_align(st))
                    self.func_shared[(fn.name, st.name)] = top
                    top += var_size(st)
        if dynamic:
            base = _align_up(top, max([16] + [var_align(d) for d in dynamic]))
            for d in dynamic:
                if d in self.mod.shared_vars:  # function-level ones are bound where declared
                    scope.bind(d.name, SpaceVar(isa.SPACE_SHARED, base, 0, d))
            self.dynamic_base = base
            top = base
        self.shared_size = top
        if top > isa.MAX_SHARED_SIZE:
            raise PtxCompileError(f"entry {self.entry.name} uses {top} bytes of static shared "
                                  f"memory (at most {isa.MAX_SHARED_SIZE})", self.entry.line,
                                  self.entry.text)
        return scope

    def alloc_local(self, size: int, align: int) -> int:
        off = _align_up(self.local_top, align)
        self.local_top = off + size
        self.local_max = max(self.local_max, self.local_top)
        return off

    # ---------------------------------------------------------------- compile
    def compile(self, builder: CodeObjectBuilder) -> None:
        entry = self.entry
        base_scope = self.layout_shared()
        self.scope = Scope(base_scope)
        params, offset = [], 0
        for p in entry.params:
            if p.space != "param":
                raise PtxUnsupportedError("kernel parameters must be .param", p.line, p.text,
                                          "Directives › Kernel and Function Directives › .entry")
            size, align = var_size(p), var_align(p)
            offset = _align_up(offset, align)
            scalar = not p.dims and not p.vector and p.type in isa.TYPES_BY_NAME
            ptype = isa.TYPES_BY_NAME[p.type] if scalar else isa.TYPE_B8
            params.append(ParamInfo(offset, size, align, ptype))
            self.scope.bind(p.name, SpaceVar(isa.SPACE_PARAM, offset, size, p))
            offset += size
        param_size = offset
        if param_size > isa.MAX_PARAM_SIZE:
            raise PtxCompileError(f"{param_size} bytes of parameters (at most "
                                  f"{isa.MAX_PARAM_SIZE})", entry.line, entry.text)
        if any(self.mod.uses_carry(fn) for fn in self.mod.reachable(entry)):
            self.cc = self.em.alloc(isa.OPND_PRED)  # CC.CF of carry chains, for the whole entry
        self.frame = FrameInfo(entry, True, self.prescan_labels(entry))
        self.stack = [entry.name]
        self.lower_block(entry.body, new_scope=False)
        code, n_r32, n_r64, n_pred = self.em.finish()
        for n, what in ((n_r32, "32-bit"), (n_r64, "64-bit"), (n_pred, "predicate")):
            if n > isa.MAX_REGS:
                raise PtxCompileError(f"entry {entry.name} needs {n} {what} registers (at most "
                                      f"{isa.MAX_REGS})", entry.line, entry.text)
        if self.local_max > isa.MAX_LOCAL_SIZE:
            raise PtxCompileError(f"entry {entry.name} needs {self.local_max} bytes of local "
                                  f"memory (at most {isa.MAX_LOCAL_SIZE})", entry.line,
                                  entry.text)
        dims = entry.maxntid or entry.reqntid
        max_threads = math.prod(dims) if dims else 0
        if max_threads > isa.MAX_BLOCK_THREADS:
            raise PtxCompileError(f".maxntid/.reqntid of {max_threads} threads (at most "
                                  f"{isa.MAX_BLOCK_THREADS})", entry.line, entry.text)
        builder.add_entry(entry.name, code, n_r32=n_r32, n_r64=n_r64, n_pred=n_pred,
                          params=params, param_size=param_size, shared_size=self.shared_size,
                          local_size=_align_up(self.local_max, 8) if self.local_max else 0,
                          max_threads=max_threads)

    def prescan_labels(self, fn: ast.Function) -> dict:
        labels = {}
        for st in _walk(fn.body):
            if isinstance(st, ast.Label):
                if st.name in labels:
                    raise PtxCompileError(f"label {st.name} defined twice", st.line,
                                          self.mod.line_text(st.line))
                labels[st.name] = self.em.label(st.name)
        return labels

    def lower_block(self, blk: ast.Block, new_scope: bool = True) -> None:
        outer = self.scope
        reg_mark, local_mark = self.em.mark(), self.local_top
        if new_scope:
            self.scope = Scope(outer)
        try:
            for st in blk.stmts:
                self.lower_statement(st, blk)
        finally:
            self.scope = outer
            self.em.release(reg_mark)
            self.local_top = local_mark

    def lower_statement(self, st, blk: ast.Block) -> None:
        if isinstance(st, ast.Instruction):
            self.lower_instruction(st)
        elif isinstance(st, ast.Label):
            self.em.place(self.frame.labels[st.name])
        elif isinstance(st, ast.RegDecl):
            self.declare_regs(st)
        elif isinstance(st, ast.VarDecl):
            self.declare_var(st, blk)
        elif isinstance(st, ast.Call):
            self.lower_call(st)
        elif isinstance(st, ast.Block):
            self.lower_block(st)
        else:
            raise AssertionError(f"unknown statement {st!r}")

    def declare_regs(self, st: ast.RegDecl) -> None:
        if st.type not in isa.TYPES_BY_NAME or st.type == "none":
            raise PtxUnsupportedError(f"registers of type .{st.type} are not supported",
                                      st.line, self.mod.line_text(st.line),
                                      "State Spaces, Types, and Variables › Types")
        f = file_of(st.type)
        for name, count in st.names:
            names = [name] if count is None else [f"{name}{i}" for i in range(count)]
            for n in names:
                if st.vector:
                    regs = tuple(self.em.alloc(f) for _ in range(st.vector))
                    self.scope.bind(n, VecRegVar(regs, st.type))
                else:
                    self.scope.bind(n, RegVar(self.em.alloc(f), st.type))

    def declare_var(self, st: ast.VarDecl, blk: ast.Block) -> None:
        if st.space == "local":
            off = self.alloc_local(var_size(st), var_align(st))
            self.scope.bind(st.name, SpaceVar(isa.SPACE_LOCAL, off, var_size(st), st))
        elif st.space == "shared":
            off = self.func_shared.get((self.frame.fn.name, st.name))
            if off is None:
                off = self.dynamic_base
            self.scope.bind(st.name, SpaceVar(isa.SPACE_SHARED, off, var_size(st), st))
        elif st.space == "param":
            slot = ParamSlot(st)
            if self.mod.slot_promotable(st, blk):
                slot.reg = self.em.alloc(file_of(st.type))
            else:
                slot.offset = self.alloc_local(var_size(st), var_align(st))
            self.scope.bind(st.name, slot)
        else:
            raise PtxUnsupportedError(f".{st.space} variables inside a function are not "
                                      "supported", st.line, st.text,
                                      "State Spaces, Types, and Variables › Variables")

    # ---------------------------------------------------------------- calls
    def lower_call(self, call: ast.Call) -> None:
        sec = section("call")
        if call.indirect:
            raise PtxUnsupportedError("indirect calls are not supported", call.line,
                                      call.text, sec)
        fn = self.mod.functions.get(call.target)
        if fn is None:
            raise PtxCompileError(f"call to undefined function {call.target}", call.line,
                                  call.text)
        if fn.kind != "func":
            raise PtxCompileError(f"{call.target} is a kernel, not a .func", call.line,
                                  call.text)
        if fn.body is None:
            raise PtxUnsupportedError(
                f"call to external function {call.target}, which has no body in this module "
                "(linking, e.g. vprintf or malloc, is not supported)", call.line, call.text, sec)
        if fn.name in self.stack:
            chain = " -> ".join(self.stack[self.stack.index(fn.name):] + [fn.name])
            raise PtxCompileError(f"recursion is not supported ({chain})", call.line,
                                  call.text)
        if len(call.args) != len(fn.params) or len(call.rets) != len(fn.rets):
            raise PtxCompileError(f"{fn.name} takes {len(fn.params)} arguments and returns "
                                  f"{len(fn.rets)} values", call.line, call.text)
        callee_scope = Scope(self.scope_root())
        for formal, actual in list(zip(fn.params, call.args)) + list(zip(fn.rets, call.rets)):
            if formal.space != "param":
                raise PtxUnsupportedError(".reg function parameters are not supported",
                                          call.line, call.text, sec)
            slot = self.lookup(actual.name) if isinstance(actual, ast.Sym) else None
            if not isinstance(slot, ParamSlot):
                raise PtxCompileError(f"call argument {actual} is not a .param variable",
                                      call.line, call.text)
            if var_size(slot.decl) < var_size(formal):
                raise PtxCompileError(f"argument {actual} is smaller than {formal.name}",
                                      call.line, call.text)
            callee_scope.bind(formal.name, slot)
        guard = 0
        if call.guard is not None:
            reg, neg = call.guard
            p = self.reg_of(reg, call)
            guard = isa.GUARD_ON | (0 if neg else isa.GUARD_NEG) | p.index
        self.em.begin(call.line, 0)
        skip = None
        if guard:
            skip = self.em.label()
            self.em.emit(isa.OP_BRA, target=skip, guard=guard)
        saved = (self.frame, self.scope)
        reg_mark, local_mark = self.em.mark(), self.local_top
        self.stack.append(fn.name)
        try:
            stmts = fn.body.stmts
            self.frame = FrameInfo(fn, False, self.prescan_labels(fn), self.em.label(fn.name),
                                   stmts[-1] if stmts else None)
            self.scope = callee_scope
            self.lower_block(fn.body, new_scope=False)
            self.em.place(self.frame.ret_label)
        finally:
            self.stack.pop()
            self.frame, self.scope = saved
            self.em.release(reg_mark)
            self.local_top = local_mark
        if skip is not None:
            self.em.place(skip)

    def scope_root(self) -> Scope:
        s = self.scope
        while s.parent is not None and s.parent is not self.mod.scope:
            s = s.parent
        return s  # the entry's shared-memory scope, whose parent is the module's


class ModuleCompiler:
    """Lays out a module's variables and compiles its entries."""

    def __init__(self, module: ast.Module):
        self.module = module
        self.functions: dict = {}
        self.shared_vars: list = []
        self.scope = Scope()
        self._names: dict = {}
        self._promotable: dict = {}
        self.module_local_size = 0
        for it in module.items:
            if isinstance(it, ast.Function):
                prev = self.functions.get(it.name)
                if prev is not None and prev.body is not None and it.body is not None:
                    raise PtxCompileError(f"function {it.name} defined twice", it.line, it.text)
                if prev is None or it.body is not None:
                    self.functions[it.name] = it

    def line_text(self, line: int) -> str:
        lines = self.module.lines
        return lines[line - 1] if 0 < line <= len(lines) else ""

    def compile(self) -> bytes:
        b = CodeObjectBuilder()
        data, const = bytearray(), bytearray()
        data_init_end = const_init_end = 0
        for it in self.module.items:
            if not isinstance(it, ast.VarDecl):
                continue
            if it.space == "shared":
                self.shared_vars.append(it)
                continue
            if it.linkage == "extern":
                self.scope.bind(it.name, ExternVar(it))
                continue
            size, align = var_size(it), var_align(it)
            if it.space == "local":
                off = _align_up(self.module_local_size, align)
                self.module_local_size = off + size
                self.scope.bind(it.name, SpaceVar(isa.SPACE_LOCAL, off, size, it))
                continue
            seg = data if it.space == "global" else const
            off = _align_up(len(seg), align)
            seg.extend(b"\0" * (off + size - len(seg)))
            if it.init is not None:
                seg[off:off + size] = encode_init(it, size)
                if it.space == "global":
                    data_init_end = off + size
                else:
                    const_init_end = off + size
            space = _SPACE_OF[it.space]
            self.scope.bind(it.name, SpaceVar(space, off, size, it))
            b.add_symbol(it.name, space, off, size)
        b.set_data(_align_up(len(data), 8), bytes(data[:data_init_end]))
        b.set_const(_align_up(len(const), 8), bytes(const[:const_init_end]))
        for it in self.module.items:
            if isinstance(it, ast.Function) and it.kind == "entry" and it.body is not None:
                EntryCompiler(self, it).compile(b)
        return b.build()

    # ---------------------------------------------------------------- analyses
    def reachable(self, entry: ast.Function) -> list:
        """The entry and every function it calls, directly or not (recursion is refused
        when the call is lowered, with its line)."""
        seen, order, todo = set(), [], [entry]
        while todo:
            fn = todo.pop()
            if fn.name in seen:
                continue
            seen.add(fn.name)
            order.append(fn)
            for st in _walk(fn.body):
                if isinstance(st, ast.Call):
                    callee = self.functions.get(st.target)
                    if callee is not None and callee.body is not None:
                        todo.append(callee)
        return order

    def uses_carry(self, fn: ast.Function) -> bool:
        return any(isinstance(st, ast.Instruction) and
                   (st.opcode in ("addc", "subc", "madc") or "cc" in st.mods)
                   for st in _walk(fn.body))

    def names_used(self, fn: ast.Function) -> set:
        names = self._names.get(fn.name)
        if names is None:
            names = set()
            for st in _walk(fn.body):
                if isinstance(st, ast.Instruction):
                    for op in st.operands:
                        _operand_names(op, names)
            self._names[fn.name] = names
        return names

    def formal_promotable(self, fn: ast.Function, decl: ast.VarDecl) -> bool:
        key = (fn.name, decl.name)
        if key not in self._promotable:
            ok = (not decl.dims and not decl.vector and decl.type in isa.TYPES_BY_NAME
                  and decl.type != "pred")
            if ok:
                bits = ptx_bits(decl.type)
                ok = all(_whole_param_access(st, decl.name, bits)
                         for st in _references(fn.body, decl.name))
            self._promotable[key] = ok
        return self._promotable[key]

    def slot_promotable(self, decl: ast.VarDecl, blk: ast.Block) -> bool:
        """May a call's `.param` variable live in a register? Only if it is a scalar that
        every access (in the caller and in the callee) reads or writes whole."""
        if decl.dims or decl.vector or decl.type not in isa.TYPES_BY_NAME or decl.type == "pred":
            return False
        bits = ptx_bits(decl.type)
        for st in _references(blk, decl.name):
            if isinstance(st, ast.Call):
                fn = self.functions.get(st.target)
                if fn is None or fn.body is None:
                    return False
                for formals, actuals in ((fn.params, st.args), (fn.rets, st.rets)):
                    for formal, actual in zip(formals, actuals):
                        if isinstance(actual, ast.Sym) and actual.name == decl.name:
                            if formal.dims or formal.vector or formal.type not in isa.TYPES_BY_NAME \
                                    or ptx_bits(formal.type) != bits \
                                    or not self.formal_promotable(fn, formal):
                                return False
            elif not _whole_param_access(st, decl.name, bits):
                return False
        return True


def compile_ptx(source: Union[str, bytes, ast.Module]) -> bytes:
    """Compile PTX text (or a parsed module) into a code object."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        try:
            source = bytes(source).decode("utf-8")
        except UnicodeDecodeError as e:
            line = bytes(source)[:e.start].count(b"\n") + 1
            raise PtxSyntaxError("PTX text is not UTF-8", line) from None
    elif not isinstance(source, (str, ast.Module)):
        raise TypeError(f"PTX must be text, bytes or a parsed module, not {type(source).__name__}")
    module = source if isinstance(source, ast.Module) else parse(source)
    return ModuleCompiler(module).compile()
