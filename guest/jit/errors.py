"""Errors of the PTX JIT: every one names the PTX line, the offending text and, where the
trouble is an instruction or a feature outside what the compiler supports, the PTX ISA
section that defines it (by title, as in NVIDIA's PTX ISA manual)."""

from __future__ import annotations


class PtxError(Exception):
    """A PTX module that cannot be compiled. `line` is 1-based (0 when not known)."""

    def __init__(self, message: str, line: int = 0, text: str = "", section: str = ""):
        self.reason = message
        self.line = line
        self.text = text.strip()
        self.section = section
        where = f"PTX line {line}: " if line else ""
        what = f" in `{self.text}`" if self.text else ""
        ref = f" (PTX ISA: {section})" if section else ""
        super().__init__(f"{where}{message}{what}{ref}")


class PtxSyntaxError(PtxError):
    """The text is not well-formed PTX."""


class PtxUnsupportedError(PtxError):
    """Well-formed PTX that uses an instruction, modifier or feature this compiler refuses."""


class PtxCompileError(PtxError):
    """Well-formed PTX that cannot be compiled: undefined names, recursion, limits, ..."""
