"""What a name in a PTX function body stands for, once the compiler has placed it.

Scopes map names to these bindings: registers (`RegVar`, `VecRegVar`), variables in a
state space (`SpaceVar`: module `.global`/`.const` data, `.shared` and `.local` variables,
kernel parameters), the `.param` variables of a call (`ParamSlot`, bound in the caller and,
for the inlined callee, under the callee's own parameter names) and functions."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from pvgpu.guest.jit.emit import Reg
from pvgpu.guest.jit.ptx import ast


@dataclass(frozen=True)
class RegVar:
    reg: Reg
    type: str  # the declared PTX type


@dataclass(frozen=True)
class VecRegVar:
    regs: tuple  # of Reg, one per component x, y, z, w
    type: str


@dataclass(frozen=True)
class SpaceVar:
    """A variable with an address in `space` (an isa.SPACE_*): for SPACE_GLOBAL/CONST the
    byte offset in the module's segment, otherwise the address in that space (shared
    offsets are final: dynamic shared memory starts after the static part)."""

    space: int
    offset: int
    size: int
    decl: object


@dataclass
class ParamSlot:
    """A `.param` variable of a call: in a register (`reg`) when every access is a whole
    scalar, else in the caller's local memory at `offset`."""

    decl: ast.VarDecl
    reg: Optional[Reg] = None
    offset: int = 0


@dataclass(frozen=True)
class FuncRef:
    fn: ast.Function


@dataclass(frozen=True)
class ExternVar:
    decl: ast.VarDecl


class Scope:
    __slots__ = ("names", "parent")

    def __init__(self, parent: Optional["Scope"] = None):
        self.names: dict = {}
        self.parent = parent

    def lookup(self, name: str):
        s = self
        while s is not None:
            b = s.names.get(name)
            if b is not None:
                return b
            s = s.parent
        return None

    def bind(self, name: str, binding) -> None:
        self.names[name] = binding


@dataclass
class FrameInfo:
    """The function being lowered: an entry or one inlined instance of a `.func`."""

    fn: ast.Function
    is_entry: bool
    labels: dict = field(default_factory=dict)
    ret_label: object = None
    last_stmt: object = None  # the body's last top-level statement (a `ret` there falls through)
