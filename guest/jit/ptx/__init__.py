"""The PTX front end: a lexer (`lexer`), an abstract syntax tree (`ast`) and a parser
(`parser`) for PTX ISA 7.x to 9.x modules as nvcc, NVRTC and numba-cuda emit them."""

from pvgpu.guest.jit.ptx.parser import parse

__all__ = ["parse"]
