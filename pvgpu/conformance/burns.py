"""Longer and longer burns: checks that must hold on any machine and under load, without timing.

Some checks need a kernel to be still running when they look: that a held chain is not
answered yet, that an event is still pending, that a caller returned without waiting for
it. No burn is long enough on a machine that stalls the check for longer, so such a check
runs as attempts with longer and longer burns (`with_longer_burns`): an attempt that finds
the burn already over has proved nothing and returns False (asserting nothing that the
stall could break), and the next attempt burns longer. A device that never keeps such work
running -- the bug these checks are for -- fails every attempt.
"""

from __future__ import annotations

LONGER_BURNS_US = (300_000, 1_500_000, 6_000_000)


def with_longer_burns(attempt, burns_us=LONGER_BURNS_US) -> int:
    """Call attempt(burn_us) for each burn length until it returns True (it saw the burn
    still running where it had to); -> that burn length. AssertionError if none did."""
    for burn_us in burns_us:
        if attempt(burn_us):
            return burn_us
    raise AssertionError(f"the burn was over before the check in every attempt "
                         f"({', '.join(f'{us / 1e6:g} s' for us in burns_us)})")
