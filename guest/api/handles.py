"""Exported handles (spec §7.5 events, §9 shared device memory): the id and secret token
the host returned for an exported object, with a text form "<prefix>:<id>:<token hex>"
that can travel to another process (or be pickled). Anyone holding a handle can import
what it names, so handles are secrets."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar

_FORM = re.compile(r"^([a-z]+):(\d+):([0-9a-fA-F]{1,16})$")


@dataclass(frozen=True)
class ExportedHandle:
    handle_id: int
    token: int

    PREFIX: ClassVar[str] = ""
    WHAT: ClassVar[str] = "a handle"  # how errors name it

    def __str__(self) -> str:
        return f"{self.PREFIX}:{self.handle_id}:{self.token:016x}"

    @classmethod
    def parse(cls, value):
        """A handle from its text form, `str(handle)`; a handle of this class is
        returned as it is. ValueError for anything else."""
        if isinstance(value, cls):
            return value
        m = _FORM.match(value) if isinstance(value, str) else None
        if m is None or m.group(1) != cls.PREFIX or int(m.group(2)) >= 1 << 64:
            raise ValueError(f"not {cls.WHAT}: {value!r} (expected '{cls.PREFIX}:<id>:<token hex>')")
        return cls(int(m.group(2)), int(m.group(3), 16))
