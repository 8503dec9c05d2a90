"""`raises`: the one assertion helper the checks need beyond `assert` (no pytest at run time)."""

from __future__ import annotations

import contextlib


@contextlib.contextmanager
def raises(exc_type):
    """Assert that the block raises exc_type (or a subclass)."""
    try:
        yield
    except exc_type:
        return
    raise AssertionError(f"{exc_type.__name__} was not raised")
