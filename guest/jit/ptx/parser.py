"""The PTX parser: tokens -> `ast.Module`.

A recursive-descent parser for the module-level directives (`.version`, `.target`,
`.address_size`), variables in every state space with alignment, array sizes and
initializers, `.entry` and `.func` definitions and prototypes (parameter and return lists,
linkage, performance directives), and function bodies: register declarations (ranges
`%r<100>` and vectors), variables, labels, `{ }` scopes, guarded instructions and calls.
Debug directives (`.loc`, `.file`, `.section`) and `.pragma` are skipped. Every error
names the line.
"""

from __future__ import annotations

from pvgpu.guest.jit.errors import PtxSyntaxError, PtxUnsupportedError
from pvgpu.guest.jit.ptx import ast
from pvgpu.guest.jit.ptx.lexer import FloatLiteral, Token, tokenize

SPACES = ("global", "const", "shared", "local", "param")
LINKAGES = ("visible", "extern", "weak", "common")
COMPONENTS = frozenset("xyzwrgba")
_PERF_DIRECTIVES = ("maxntid", "reqntid", "minnctapersm", "maxnctapersm", "maxnreg",
                    "reqnctapercluster", "maxclusterrank", "explicitcluster",
                    "blocksareclusters", "noreturn", "abi_preserve", "abi_preserve_control")
_EOF = Token("eof", None, 0, "<end of file>")
_TEXTURE_SECTION = "State Spaces, Types, and Variables › Texture Sampler and Surface Types"


class Parser:
    def __init__(self, text: str):
        self.lines = text.splitlines()
        self.toks = tokenize(text)
        self.i = 0

    # ---------------------------------------------------------------- helpers
    def line_text(self, line: int) -> str:
        return self.lines[line - 1] if 0 < line <= len(self.lines) else ""

    def error(self, message: str, tok: Token | None = None) -> PtxSyntaxError:
        tok = tok or self.peek()
        line = tok.line or (len(self.lines) or 1)
        return PtxSyntaxError(message, line, self.line_text(line))

    def peek(self, k: int = 0) -> Token:
        j = self.i + k
        return self.toks[j] if j < len(self.toks) else _EOF

    def next(self) -> Token:
        tok = self.peek()
        if tok is _EOF:
            raise self.error("unexpected end of file")
        self.i += 1
        return tok

    def at(self, kind: str, value=None) -> bool:
        tok = self.peek()
        return tok.kind == kind and (value is None or tok.value == value)

    def accept(self, kind: str, value=None) -> Token | None:
        if self.at(kind, value):
            return self.next()
        return None

    def expect(self, kind: str, value=None, what: str = "") -> Token:
        if not self.at(kind, value):
            tok = self.peek()
            want = what or (repr(value) if value is not None else kind)
            raise self.error(f"expected {want}, found {tok.text!r}", tok)
        return self.next()

    def expect_int(self) -> int:
        neg = self.accept("punct", "-") is not None
        v = self.expect("int", what="an integer").value
        return -v if neg else v

    def skip_line(self, line: int) -> None:
        while self.peek() is not _EOF and self.peek().line == line:
            self.i += 1

    def skip_to_semicolon(self) -> None:
        while not self.accept("punct", ";"):
            self.next()

    # ---------------------------------------------------------------- module
    def module(self) -> ast.Module:
        version, target, address_size = "", "", 64
        items: list = []
        linkage = ""
        while self.peek() is not _EOF:
            tok = self.next()
            if tok.kind != "dot":
                raise self.error(f"expected a directive, found {tok.text!r}", tok)
            d = tok.value[1:]
            if d == "version":
                v = self.next()
                version = v.text
            elif d == "target":
                names = [self.expect("ident", what="a target name").value]
                while self.accept("punct", ","):
                    names.append(self.expect("ident", what="a target option").value)
                target = ",".join(names)
            elif d == "address_size":
                address_size = self.expect("int").value
                if address_size not in (32, 64):
                    raise self.error(f"bad .address_size {address_size}", tok)
            elif d in ("file", "loc"):
                self.skip_line(tok.line)
            elif d == "section":
                self.skip_section()
            elif d == "pragma":
                self.skip_to_semicolon()
            elif d in LINKAGES:
                linkage = d
                continue
            elif d in ("entry", "func"):
                items.append(self.function(d, linkage, tok))
            elif d in ("global", "const", "shared", "local"):
                items.extend(self.var_decls(d, linkage, tok))
                self.expect("punct", ";")
            elif d in ("texref", "samplerref", "surfref", "tex"):
                raise PtxUnsupportedError(f"module-level .{d} variables are not supported",
                                          tok.line, self.line_text(tok.line), _TEXTURE_SECTION)
            elif d == "alias":
                raise PtxUnsupportedError(".alias is not supported", tok.line,
                                          self.line_text(tok.line),
                                          "Directives › Linking Directives › .alias")
            else:
                raise self.error(f"unknown module directive .{d}", tok)
            linkage = ""
        if not version or not target:
            raise PtxSyntaxError("missing .version or .target directive", 1, self.line_text(1))
        return ast.Module(version, target, address_size, items, self.lines)

    def skip_section(self) -> None:
        self.next()  # the section name
        self.expect("punct", "{")
        depth = 1
        while depth:
            tok = self.next()
            if tok.kind == "punct" and tok.value == "{":
                depth += 1
            elif tok.kind == "punct" and tok.value == "}":
                depth -= 1

    # ---------------------------------------------------------------- variables
    def var_decls(self, space: str, linkage: str, first: Token, single: bool = False) -> list:
        """`.space [.align N] [.vN] .type name[dims] [= init] {, name...}` (no `;`);
        `single`: one name only (a parameter list item)."""
        align, vector, type_, ptr, ptr_align = 0, 0, "", False, 0
        while self.at("dot"):
            t = self.next()
            d = t.value[1:]
            if d == "align":
                value = self.expect("int").value
                if value <= 0 or value & (value - 1):
                    raise self.error(f"alignment {value} is not a power of two", t)
                if ptr:
                    ptr_align = value  # `.ptr ... .align N`: the pointee's alignment
                else:
                    align = value
            elif d in ("v2", "v4", "v8"):
                vector = int(d[1:])
            elif d == "ptr":
                ptr = True
            elif d == "attribute":
                self.expect("punct", "(")
                while not self.accept("punct", ")"):
                    self.next()
            elif d in SPACES or d in ("shared::cta",):
                continue  # the pointee space of a .ptr parameter
            elif d in ("managed",):
                continue
            elif d in ("texref", "samplerref", "surfref"):
                raise PtxUnsupportedError(f".{d} variables are not supported", t.line,
                                          self.line_text(t.line), _TEXTURE_SECTION)
            else:
                if type_:
                    raise self.error(f"unexpected {t.text} after the type .{type_}", t)
                type_ = d
        if not type_:
            raise self.error("variable without a type", first)
        out = []
        while True:
            name_tok = self.expect("ident", what="a variable name")
            dims: list = []
            while self.accept("punct", "["):
                if self.accept("punct", "]"):
                    dims.append(None)
                    continue
                dims.append(self.expect_int())
                self.expect("punct", "]")
            # `%r<4>` only in .reg; here `<` is an error
            init = None
            if self.accept("punct", "="):
                init = self.initializer()
            out.append(ast.VarDecl(first.line, space, type_, name_tok.value, align, tuple(dims),
                                   vector, init, linkage, ptr, self.line_text(first.line),
                                   ptr_align))
            if single or not self.accept("punct", ","):
                return out

    def initializer(self):
        if self.accept("punct", "{"):
            items = []
            if not self.at("punct", "}"):
                items.append(self.initializer())
                while self.accept("punct", ","):
                    items.append(self.initializer())
            self.expect("punct", "}")
            return items
        neg = self.accept("punct", "-") is not None
        tok = self.next()
        if tok.kind == "int":
            return -tok.value if neg else tok.value
        if tok.kind == "float":
            return ast.FImm(tok.value, neg)
        if tok.kind == "ident" and not neg:
            generic = False
            name = tok.value
            if name in ("generic", "global", "const", "shared", "local") and self.accept("punct", "("):
                generic = True
                name = self.expect("ident", what="a variable name").value
                self.expect("punct", ")")
            off = 0
            if self.accept("punct", "+"):
                off = self.expect_int()
            return ("addr", name, off, generic)
        raise self.error(f"bad initializer {tok.text!r}", tok)

    # ---------------------------------------------------------------- functions
    def param_list(self) -> list:
        self.expect("punct", "(")
        params = []
        if self.accept("punct", ")"):
            return params
        while True:
            t = self.expect("dot", what="a parameter declaration")
            space = t.value[1:]
            if space not in ("param", "reg"):
                raise self.error(f"expected .param or .reg, found {t.text}", t)
            decl = self.var_decls(space, "", t, single=True)
            params.extend(decl)
            if self.accept("punct", ")"):
                return params
            self.expect("punct", ",")

    def function(self, kind: str, linkage: str, first: Token) -> ast.Function:
        rets: list = []
        if kind == "func" and self.at("punct", "("):
            rets = self.param_list()
        name = self.expect("ident", what="a function name").value
        params: list = []
        if self.at("punct", "("):
            params = self.param_list()
        fn = ast.Function(first.line, kind, name, params, rets, None, linkage,
                          text=self.line_text(first.line))
        while self.at("dot"):
            t = self.next()
            d = t.value[1:]
            if d == "pragma":
                self.skip_to_semicolon()
                continue
            if d not in _PERF_DIRECTIVES:
                raise self.error(f"unknown function directive {t.text}", t)
            nums = []
            if self.at("int"):
                nums.append(self.next().value)
                while self.accept("punct", ","):
                    nums.append(self.expect("int").value)
            if d == "maxntid":
                fn.maxntid = tuple(nums)
            elif d == "reqntid":
                fn.reqntid = tuple(nums)
            elif d == "noreturn":
                fn.noreturn = True
        if self.accept("punct", ";"):
            return fn  # a prototype
        fn.body = self.block(self.expect("punct", "{", what="'{' or ';'"))
        return fn

    # ---------------------------------------------------------------- bodies
    def block(self, open_tok: Token) -> ast.Block:
        blk = ast.Block(open_tok.line)
        stmts = blk.stmts
        while True:
            tok = self.peek()
            if tok is _EOF:
                raise self.error("unterminated block (missing '}')", open_tok)
            if tok.kind == "punct":
                if tok.value == "}":
                    self.i += 1
                    return blk
                if tok.value == "{":
                    self.i += 1
                    stmts.append(self.block(tok))
                    continue
                if tok.value == "@":
                    stmts.append(self.instruction())
                    continue
                if tok.value == ";":
                    self.i += 1
                    continue
                raise self.error(f"unexpected {tok.text!r}", tok)
            if tok.kind == "dot":
                self.i += 1
                d = tok.value[1:]
                if d == "reg":
                    stmts.append(self.reg_decl(tok))
                elif d in ("local", "shared", "param", "global", "const"):
                    stmts.extend(self.var_decls(d, "", tok))
                    self.expect("punct", ";")
                elif d in ("loc", "file"):
                    self.skip_line(tok.line)
                elif d == "pragma":
                    self.skip_to_semicolon()
                elif d in ("visible", "extern", "weak"):
                    continue
                else:
                    raise self.error(f"unexpected directive {tok.text} in a function body", tok)
                continue
            if tok.kind == "ident" and self.peek(1).kind == "punct" and self.peek(1).value == ":":
                self.i += 2
                stmts.append(ast.Label(tok.line, tok.value))
                continue
            if tok.kind == "ident":
                stmts.append(self.instruction())
                continue
            raise self.error(f"unexpected {tok.text!r}", tok)

    def reg_decl(self, first: Token) -> ast.RegDecl:
        vector, type_ = 0, ""
        while self.at("dot"):
            d = self.next().value[1:]
            if d in ("v2", "v4", "v8"):
                vector = int(d[1:])
            elif d == "align":
                self.expect("int")
            else:
                type_ = d
        if not type_:
            raise self.error(".reg without a type", first)
        names = []
        while True:
            name = self.expect("ident", what="a register name").value
            count = None
            if self.accept("punct", "<"):
                count = self.expect("int").value
                self.expect("punct", ">")
            names.append((name, count))
            if not self.accept("punct", ","):
                break
        self.expect("punct", ";")
        return ast.RegDecl(first.line, type_, names, vector)

    def instruction(self):
        first = self.peek()
        guard = None
        if self.accept("punct", "@"):
            neg = self.accept("punct", "!") is not None
            g = self.expect("ident", what="a guard predicate")
            guard = (ast.Reg(g.value), neg)
        op_tok = self.expect("ident", what="an instruction")
        mods = []
        while self.at("dot"):
            mods.append(self.next().value[1:])
        text = self.line_text(first.line)
        if op_tok.value == "call":
            return self.call(first.line, guard, mods, text)
        operands = []
        if not self.at("punct", ";"):
            operands.append(self.operand())
            while self.accept("punct", ","):
                operands.append(self.operand())
        if not self.at("punct", ";"):
            tok = self.peek()
            # a missing ';' is reported on the instruction's line, not on the next one
            line = first.line if tok.line != first.line else tok.line
            raise PtxSyntaxError(f"expected ';' or ',', found {tok.text!r}", line,
                                 self.line_text(line))
        self.next()
        return ast.Instruction(first.line, op_tok.value, tuple(mods), operands, guard, text)

    def call(self, line: int, guard, mods: list, text: str) -> ast.Call:
        uni = "uni" in mods
        rets: list = []
        if self.accept("punct", "("):
            while not self.accept("punct", ")"):
                rets.append(self.operand())
                self.accept("punct", ",")
            self.expect("punct", ",")
        target_tok = self.expect("ident", what="a call target")
        args: list = []
        proto = None
        if self.accept("punct", ","):
            if self.accept("punct", "("):
                while not self.accept("punct", ")"):
                    args.append(self.operand())
                    self.accept("punct", ",")
                if self.accept("punct", ","):
                    proto = self.expect("ident", what="a prototype").value
            else:
                proto = self.expect("ident", what="an argument list or prototype").value
        self.expect("punct", ";")
        return ast.Call(line, uni, target_tok.value, rets, args, guard, proto,
                        target_tok.value.startswith("%"), text)

    def operand(self):
        tok = self.next()
        k, v = tok.kind, tok.value
        if k == "ident":
            if v == "WARP_SZ":
                return ast.Imm(32)
            if v.startswith("%"):
                reg = ast.Reg(v)
                nxt = self.peek()
                if nxt.kind == "dot" and nxt.value[1:] in COMPONENTS:
                    self.i += 1
                    reg = ast.Reg(v, nxt.value[1:])
                if self.accept("punct", "|"):
                    second = self.expect("ident", what="a register")
                    return ast.Pair(reg, ast.Reg(second.value))
                return reg
            if self.accept("punct", "|"):
                second = self.expect("ident", what="a register")
                return ast.Pair(ast.Reg(v), ast.Reg(second.value))
            off = 0
            if self.at("punct", "+"):
                self.i += 1
                off = self.expect_int()
            elif self.at("punct", "-") and self.peek(1).kind == "int":
                self.i += 1
                off = -self.next().value
            return ast.Sym(v, off)
        if k == "int":
            return ast.Imm(v)
        if k == "float":
            return ast.FImm(v)
        if k == "punct":
            if v == "-":
                t = self.next()
                if t.kind == "int":
                    return ast.Imm(-t.value)
                if t.kind == "float":
                    return ast.FImm(t.value, True)
                raise self.error(f"expected a number after '-', found {t.text!r}", t)
            if v == "!":
                r = self.expect("ident", what="a predicate")
                return ast.Not(ast.Reg(r.value))
            if v == "_":
                return ast.Sink()
            if v == "[":
                return self.address()
            if v == "{":
                items = []
                if not self.at("punct", "}"):
                    items.append(self.operand())
                    while self.accept("punct", ","):
                        items.append(self.operand())
                self.expect("punct", "}")
                return ast.Vec(tuple(items))
        raise self.error(f"unexpected {tok.text!r} in an operand", tok)

    def address(self) -> ast.Addr:
        base = None
        off = 0
        if self.at("int") or self.at("punct", "-"):
            off = self.expect_int()
        else:
            t = self.expect("ident", what="an address")
            base = ast.Reg(t.value) if t.value.startswith("%") else ast.Sym(t.value)
            if self.accept("punct", "+"):
                off = self.expect_int()
            elif self.accept("punct", "-"):
                off = -self.expect("int").value
            if self.at("punct", ","):  # [tex, {coordinates}] of texture and surface forms
                items = [base]
                while self.accept("punct", ","):
                    items.append(self.operand())
                self.expect("punct", "]")
                return ast.Vec(tuple(items))
        self.expect("punct", "]")
        return ast.Addr(base, off)


def parse(text: str) -> ast.Module:
    """Parse one PTX module."""
    return Parser(text).module()


__all__ = ["parse", "Parser", "FloatLiteral"]
