"""The null backend: the skeleton a chip vendor copies to add a device family (see docs/writing-a-backend.md).

It is never available (its probe says so) and every device method raises NotSupportedError, which
makes it both the template and a fixture for registry tests. It is not registered in HAL's own
entry points; a vendor's copy registers itself in its own package's ``pyproject.toml``::

    [project.entry-points."hal.backends"]
    mychip = "hal_mychip:MyChipBackend"
"""
from __future__ import annotations

from typing import Any

from hal.backend import Availability, Backend, DeviceProperties
from hal.errors import NotSupportedError
from hal.memory import MemoryStats
from hal.streams import Event, Stream


class NullBackend(Backend):
    """Implements the whole interface; every device operation raises NotSupportedError."""

    name = "null"
    device_type = "null"
    priority = -1
    dist_backend = "gloo"
    device_files = ()  # e.g. ("/dev/mychip*",): lets HAL warn when the card is there but the SDK is not

    @classmethod
    def probe(cls) -> Availability:
        # A real backend: try: import my_sdk; except ImportError as e: return Availability.no(f"... {e}")
        # then check a device is visible WITHOUT creating a context, e.g. a device-count query.
        return Availability.no("the null backend is a template and has no device")

    def _unsupported(self, what: str) -> NotSupportedError:
        return NotSupportedError(what, self.name, ["the null backend has no device"])

    def device_count(self) -> int:
        return 0

    def device_properties(self, index: int = 0) -> DeviceProperties:
        raise self._unsupported("device_properties")

    def memory_stats(self, device: Any = None) -> MemoryStats:
        raise self._unsupported("memory_stats")

    def reset_peak_memory_stats(self, device: Any = None) -> None:
        raise self._unsupported("reset_peak_memory_stats")

    def create_stream(self, device: Any = None, priority: int = 0) -> Stream:
        raise self._unsupported("create_stream")

    def current_stream(self, device: Any = None) -> Stream:
        raise self._unsupported("current_stream")

    def create_event(self, enable_timing: bool = False) -> Event:
        raise self._unsupported("create_event")
