"""Memory statistics as plain data."""
from __future__ import annotations

import dataclasses
from typing import Optional


@dataclasses.dataclass(frozen=True)
class MemoryStats:
    """Allocator statistics of one device, in bytes.

    ``allocated``: held by live tensors; ``reserved``: held by the allocator (cached included);
    ``peak``: the highest ``allocated`` since the last reset; ``total``/``free``: the device's
    memory as the driver (or, on the CPU, the OS) reports it. ``source`` names where the figures
    come from (e.g. ``"torch.cuda.memory_stats"``, ``"cupy.MemoryPool"``, ``"process RSS"``).
    ``peak_reserved``: the highest ``reserved`` since the last reset, None where the backend does not
    track it (what ``torch.cuda.max_memory_reserved`` answers).
    """

    allocated: int
    reserved: int
    peak: int
    total: int
    free: int
    source: str = ""
    peak_reserved: Optional[int] = None

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)
