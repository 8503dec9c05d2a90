"""The PTX abstract syntax tree: a `Module` of variables and functions; a function's body
is a `Block` of statements (register and variable declarations, labels, instructions,
nested blocks). Operands keep PTX's own forms; the compiler gives them meaning."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Union

from pvgpu.guest.jit.ptx.lexer import FloatLiteral


# ------------------------------------------------------------------ operands
@dataclass(frozen=True)
class Reg:
    """A register or special register: `%r1`, `%tid` with component `x`, `%SP`."""

    name: str
    component: Optional[str] = None

    def __str__(self) -> str:
        return self.name + (f".{self.component}" if self.component else "")


@dataclass(frozen=True)
class Imm:
    """An integer literal (already negated where the text had a minus sign)."""

    value: int

    def __str__(self) -> str:
        return str(self.value)


@dataclass(frozen=True)
class FImm:
    """A float literal."""

    literal: FloatLiteral
    negative: bool = False

    def __str__(self) -> str:
        return ("-" if self.negative else "") + repr(self.literal.value)


@dataclass(frozen=True)
class Sym:
    """A name: a variable, a parameter, a label or a function (plus a byte offset)."""

    name: str
    offset: int = 0

    def __str__(self) -> str:
        return self.name + (f"+{self.offset}" if self.offset else "")


@dataclass(frozen=True)
class Addr:
    """A memory operand `[base+offset]`; base is a Reg, a Sym or None (absolute)."""

    base: Union[Reg, Sym, None]
    offset: int = 0

    def __str__(self) -> str:
        b = str(self.base) if self.base is not None else ""
        if self.offset and b:
            return f"[{b}+{self.offset}]"
        return f"[{b or self.offset}]"


@dataclass(frozen=True)
class Vec:
    """A vector operand `{a, b, ...}`."""

    items: tuple

    def __str__(self) -> str:
        return "{" + ", ".join(map(str, self.items)) + "}"


@dataclass(frozen=True)
class Not:
    """A negated predicate source `!%p`."""

    reg: Reg

    def __str__(self) -> str:
        return f"!{self.reg}"


@dataclass(frozen=True)
class Pair:
    """Two destinations `%p|%q` (setp) or `%r|%p` (shfl)."""

    first: Reg
    second: Reg

    def __str__(self) -> str:
        return f"{self.first}|{self.second}"


@dataclass(frozen=True)
class Sink:
    """The sink operand `_`."""

    def __str__(self) -> str:
        return "_"


Operand = Union[Reg, Imm, FImm, Sym, Addr, Vec, Not, Pair, Sink]


# ------------------------------------------------------------------ statements
@dataclass
class Instruction:
    line: int
    opcode: str  # the base name: "ld", "setp", ...
    mods: tuple  # the modifiers without dots: ("global", "nc", "v4", "f32")
    operands: list
    guard: Optional[tuple] = None  # (Reg, negated)
    text: str = ""  # the source line, for messages

    @property
    def full_name(self) -> str:
        return ".".join((self.opcode,) + tuple(self.mods))


@dataclass
class Call:
    line: int
    uni: bool
    target: str
    rets: list  # names of .param variables receiving the results
    args: list  # operands: names of .param variables (Sym), or others for error messages
    guard: Optional[tuple] = None
    prototype: Optional[str] = None
    indirect: bool = False
    text: str = ""


@dataclass
class Label:
    line: int
    name: str


@dataclass
class RegDecl:
    line: int
    type: str  # "b32", "pred", ...
    names: list  # (name, count or None): count for `%r<100>` (names %r0 .. %r99)
    vector: int = 0  # .v2 / .v4 registers


@dataclass
class VarDecl:
    """A variable in a state space (.global/.const/.shared/.local/.param)."""

    line: int
    space: str
    type: str
    name: str
    align: int = 0  # 0: the natural alignment of the type
    dims: tuple = ()  # array dimensions; None for an unsized `[]`
    vector: int = 0
    init: object = None  # an initializer: a number, a list (nested), or None
    linkage: str = ""  # "visible", "extern", "weak", "common" or ""
    ptr: bool = False  # .param .u64 .ptr ... (a pointer attribute, no effect here)
    text: str = ""
    ptr_align: int = 0  # `.ptr [.space] .align N`: the alignment of the memory pointed to


@dataclass
class Block:
    line: int
    stmts: list = field(default_factory=list)


@dataclass
class Function:
    line: int
    kind: str  # "entry" or "func"
    name: str
    params: list  # VarDecl (space "param" or "reg")
    rets: list  # VarDecl, .func only
    body: Optional[Block]
    linkage: str = ""
    maxntid: tuple = ()
    reqntid: tuple = ()
    noreturn: bool = False
    text: str = ""


@dataclass
class Module:
    version: str
    target: str
    address_size: int
    items: list  # VarDecl and Function, in source order
    lines: list  # the source text, one string per line
