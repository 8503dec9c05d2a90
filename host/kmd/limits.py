"""What the KMD lets one context have: its user VA range and how many of each object.

The KMD knows nothing of the guest protocol. Whoever creates a context may bound it
(KmdDevice(limits=...) for every context of a device, create_context(limits=...) for one):
host/backend translates the wire's limits (spec/pvgpu.md §6) into a ContextLimits and
gives it to each context it creates for a guest. Without one a context gets what the
hardware allows: the whole VA space but page 0, and counts bounded only by the pages
of that space (each reservation, mapping or import takes at least one) and by the
largest LAUNCH packet. A count at its limit raises LimitReached (an OutOfMemory that no
eviction cures), which the backend reports as RESP_ERR_LIMIT.
"""

from __future__ import annotations

from dataclasses import dataclass

from pvgpu.host.hw import packets, regs

_VA_SPACE = 1 << regs.VA_BITS
_VA_PAGES = _VA_SPACE // regs.PAGE_SIZE


@dataclass(frozen=True)
class ContextLimits:
    va_base: int = regs.PAGE_SIZE  # the user VA range [va_base, va_limit): allocations,
    va_limit: int = _VA_SPACE  # reservations; page 0 is never mapped
    max_va_align: int = _VA_SPACE  # the largest alignment reserve_va accepts
    max_va_reservations: int = _VA_PAGES  # live reserve_va ranges
    max_va_mappings: int = _VA_PAGES  # live map_bo_at mappings
    max_imports: int = _VA_PAGES  # live dma-buf imports
    max_kernel_args: int = packets.MAX_LAUNCH_ARGS  # arguments of one built-in launch

    def __post_init__(self):
        for name, v in vars(self).items():
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ValueError(f"bad context limit {name}={v!r}")
        if self.va_base % regs.PAGE_SIZE or self.va_limit % regs.PAGE_SIZE \
                or not self.va_base < self.va_limit <= _VA_SPACE:
            raise ValueError(f"bad user VA range [{self.va_base:#x}, {self.va_limit:#x})")
        if self.max_kernel_args > packets.MAX_LAUNCH_ARGS:
            raise ValueError(f"{self.max_kernel_args} kernel arguments do not fit a LAUNCH "
                             f"packet (max {packets.MAX_LAUNCH_ARGS})")
