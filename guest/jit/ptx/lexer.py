"""The PTX lexer: text -> tokens, each with its kind, value and 1-based line.

Kinds: `ident` (identifiers, registers such as `%r1`, labels such as `$L__BB0_2`),
`dot` (a directive or an instruction modifier such as `.global` or `.L2::128B`), `int`
(value: a Python int), `float` (value: a `FloatLiteral`), `str` (a quoted string) and
`punct` (one of `{}()[];,:+-!@|<>=_`). Comments and white space are dropped. Integer
literals are decimal, hexadecimal (`0x`), octal (leading `0`) or binary (`0b`), each with
an optional `U` suffix; float literals are `0fHHHHHHHH` (the bits of an f32),
`0dHHHHHHHHHHHHHHHH` (the bits of an f64) or decimal (`1.5`, `2e-3`: an f64 value).
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass

from pvgpu.guest.jit.errors import PtxSyntaxError


@dataclass(frozen=True)
class FloatLiteral:
    """A float literal: `width` 32 (`0f`), 64 (`0d`) or 0 (decimal, an f64 value);
    `bits` is the literal's bit pattern in that width (f64 bits for decimal ones)."""

    width: int
    bits: int

    @property
    def value(self) -> float:
        if self.width == 32:
            return struct.unpack("<f", struct.pack("<I", self.bits))[0]
        return struct.unpack("<d", struct.pack("<Q", self.bits))[0]


class Token:
    __slots__ = ("kind", "value", "line", "text")

    def __init__(self, kind: str, value, line: int, text: str):
        self.kind = kind
        self.value = value
        self.line = line
        self.text = text

    def __repr__(self) -> str:
        return f"Token({self.kind}, {self.text!r}, line {self.line})"


_FOLLOW = r"(?![0-9A-Za-z_$])"
_TOKEN_RE = re.compile(
    r"(?P<ws>[ \t\r\f\v]+)"
    r"|(?P<nl>\n)"
    r"|(?P<lc>//[^\n]*)"
    r"|(?P<bc>/\*(?:.|\n)*?\*/)"
    r"|(?P<str>\"(?:[^\"\\\n]|\\.)*\")"
    rf"|(?P<hexf>0[fF][0-9a-fA-F]{{8}}){_FOLLOW}"
    rf"|(?P<hexd>0[dD][0-9a-fA-F]{{16}}){_FOLLOW}"
    rf"|(?P<decf>(?:[0-9]+\.[0-9]*(?:[eE][+-]?[0-9]+)?|[0-9]+[eE][+-]?[0-9]+)){_FOLLOW}"
    rf"|(?P<hexi>0[xX][0-9a-fA-F]+U?){_FOLLOW}"
    rf"|(?P<bini>0[bB][01]+U?){_FOLLOW}"
    rf"|(?P<octi>0[0-7]+U?){_FOLLOW}"
    rf"|(?P<deci>[0-9]+U?){_FOLLOW}"
    r"|(?P<dot>\.(?:[A-Za-z_]|[0-9]+[A-Za-z])[A-Za-z0-9_$]*(?:::[A-Za-z0-9_]+)*)"
    r"|(?P<ident>[A-Za-z][A-Za-z0-9_$]*|[_$%][A-Za-z0-9_$]+)"
    r"|(?P<punct>[{}()\[\];,:+\-!@|<>=_])"
    r"|(?P<bad>.)")


def parse_int(text: str) -> int:
    """The value of one PTX integer literal (without sign)."""
    t = text[:-1] if text.endswith("U") else text
    if t[:2] in ("0x", "0X"):
        return int(t[2:], 16)
    if t[:2] in ("0b", "0B"):
        return int(t[2:], 2)
    if len(t) > 1 and t[0] == "0":
        return int(t[1:], 8)
    return int(t, 10)


def tokenize(text: str) -> list[Token]:
    tokens: list[Token] = []
    append = tokens.append
    line = 1
    for m in _TOKEN_RE.finditer(text):
        kind = m.lastgroup
        s = m.group()
        if kind == "ws" or kind == "lc":
            continue
        if kind == "nl":
            line += 1
            continue
        if kind == "bc":
            line += s.count("\n")
            continue
        if kind in ("deci", "hexi", "octi", "bini"):
            append(Token("int", parse_int(s), line, s))
        elif kind == "hexf":
            append(Token("float", FloatLiteral(32, int(s[2:], 16)), line, s))
        elif kind == "hexd":
            append(Token("float", FloatLiteral(64, int(s[2:], 16)), line, s))
        elif kind == "decf":
            bits = struct.unpack("<Q", struct.pack("<d", float(s)))[0]
            append(Token("float", FloatLiteral(0, bits), line, s))
        elif kind == "bad":
            raise PtxSyntaxError(f"unexpected character {s!r}", line, text.splitlines()[line - 1]
                                 if line <= len(text.splitlines()) else "")
        else:
            append(Token(kind, s, line, s))
    return tokens
