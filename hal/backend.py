"""The backend interface every device family implements, and the plain data it returns.

A backend is a class discovered through the ``hal.backends`` entry-point namespace. Its identity
(``name``, ``device_type``, ``priority``, ``dist_backend``) is class-level data and :meth:`Backend.probe`
is a classmethod, so discovery never instantiates anything or touches a device. Import of a
vendor SDK happens only inside :meth:`Backend.probe` or at first use, never at module import.

Most device families subclass :class:`hal.device_backend.TorchDeviceBackend`, which implements the
device, memory, stream, event and RNG methods over torch's per-device module; ``Backend`` itself is
for devices that have no such module (the CPU). The interface covers devices, memory, streams and
events, RNG, environment variables (``env_map``, ``visible_devices_env``), collectives and ops.

An instance is created only for an available backend (``hal.get_backend``); it is cheap, stateless
beyond caches, and safe to share between threads unless a method says otherwise.
"""
from __future__ import annotations

import abc
import contextlib
import dataclasses
import glob
import importlib
import os
import pathlib
from typing import Any, ClassVar, Iterator, Mapping, Optional, Sequence

import torch

from hal.errors import NotSupportedError
from hal.memory import MemoryStats
from hal.streams import Event, Stream


@dataclasses.dataclass(frozen=True)
class Availability:
    """Whether a backend can be used in this process, and why not."""

    available: bool
    reason: str = ""

    @classmethod
    def ok(cls, reason: str = "available") -> "Availability":
        return cls(True, reason)

    @classmethod
    def no(cls, reason: str) -> "Availability":
        return cls(False, reason)


@dataclasses.dataclass(frozen=True)
class DeviceProperties:
    """Properties of one device, fixed for the device's lifetime.

    ``capability`` is the vendor's own architecture version (an SM version on CUDA, the MLU
    architecture generation on MLU, ``None`` on the CPU); never compare it across vendors.
    ``dtypes`` are the dtypes the device computes natively; ``downcasts`` maps a dtype the device
    accepts but silently computes in a narrower one (``{"float64": "float32"}`` on MLU).
    ``peaks`` holds measured or published ceilings used for rooflines (``copy_bytes_per_s``,
    ``flops_per_s.<dtype>``) with their provenance in ``peaks_source``.
    """

    index: int
    name: str
    total_memory: int
    capability: Optional[tuple[int, int]] = None
    dtypes: tuple[str, ...] = ()
    downcasts: Mapping[str, str] = dataclasses.field(default_factory=dict)
    features: tuple[str, ...] = ()
    peaks: Mapping[str, float] = dataclasses.field(default_factory=dict)
    peaks_source: str = ""
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float32`` -> ``"float32"`` (the spelling used in all HAL data)."""
    return str(dtype).replace("torch.", "")


class Backend(abc.ABC):
    """One device family (cpu, cuda, mlu, ...).

    Subclasses set the class attributes and implement the abstract methods. Everything marked
    "class-level" must work without an instance and without a device. Methods that take a
    ``device`` accept an index, a ``torch.device`` or ``None`` for the current device.

    Raises: methods raise :class:`hal.errors.NotSupportedError` for what the device cannot do,
    never return ``None`` to mean "unsupported".
    """

    #: entry-point name and HAL name of the backend (class-level)
    name: ClassVar[str]
    #: torch device type of its tensors ("cpu", "cuda", "mlu")
    device_type: ClassVar[str]
    #: higher wins automatic selection (cpu 0, cuda 200, mlu 300)
    priority: ClassVar[int] = 0
    #: torch.distributed backend name for this device ("gloo", "nccl", "cncl")
    dist_backend: ClassVar[str] = "gloo"
    #: torch.profiler activity name for device time ("CUDA", "PrivateUse1"), None for host only
    profiler_activity: ClassVar[Optional[str]] = None
    #: device files whose presence suggests the hardware is here (for "plugin failed" warnings)
    device_files: ClassVar[tuple[str, ...]] = ()
    #: reduce ops the collective library rejects (names of torch.distributed.ReduceOp members)
    unsupported_reduce_ops: ClassVar[frozenset[str]] = frozenset()
    #: data files shipped next to the backend's module (see :meth:`data_file`)
    migration_rules_file: ClassVar[str] = "migration_rules.yaml"
    manifest_file: ClassVar[str] = "manifest.json"
    #: CUDA variable -> this backend's counterpart, a two-column TSV next to the module (see :meth:`env_map`)
    env_map_file: ClassVar[str] = "env_map.tsv"
    #: environment variable that restricts the devices a process sees ("CUDA_VISIBLE_DEVICES"); None: none
    visible_devices_env: ClassVar[Optional[str]] = None

    # ---- discovery (class-level, cheap, creates no device context) -----------------------
    @classmethod
    @abc.abstractmethod
    def probe(cls) -> Availability:
        """Say whether the backend is usable here. Imports the SDK inside ``try``; never raises."""

    @classmethod
    def versions(cls) -> dict[str, str]:
        """Versions of the libraries the backend uses (only those importable; never raises)."""
        return {"torch": torch.__version__}

    @classmethod
    def hardware_present(cls) -> list[str]:
        """Device files present on this machine that hint the hardware is here."""
        found: list[str] = []
        for pattern in cls.device_files:
            found.extend(sorted(glob.glob(pattern)))
        return found

    @classmethod
    def data_file(cls, filename: str) -> Optional[pathlib.Path]:
        """Path of ``filename`` in the backend's package folder, or None if it has none.

        Backends ship data, not code, for what an audit needs without the device: the capability
        manifest (``manifest_file``) and the migration rules (``migration_rules_file``)."""
        module = importlib.import_module(cls.__module__)
        folder = pathlib.Path(module.__file__).parent
        path = folder / filename
        return path if path.is_file() else None

    # ---- devices ----------------------------------------------------------------------------
    @abc.abstractmethod
    def device_count(self) -> int:
        """Number of devices visible to this process."""

    @abc.abstractmethod
    def device_properties(self, index: int = 0) -> DeviceProperties:
        """Properties of device ``index`` (raises IndexError when out of range)."""

    def devices(self) -> list[DeviceProperties]:
        return [self.device_properties(i) for i in range(self.device_count())]

    def torch_device(self, device: Any = None) -> torch.device:
        """The ``torch.device`` for ``device`` (index, torch.device or None for current)."""
        if isinstance(device, torch.device):
            return device
        if device is None:
            device = self.current_device()
        if self.device_type == "cpu":
            return torch.device("cpu")
        return torch.device(self.device_type, int(device))

    def current_device(self) -> int:
        return 0

    def set_device(self, index: int) -> None:
        if index != 0:
            raise NotSupportedError(f"device index {index}", self.name, ["only device 0 exists"])

    def synchronize(self, device: Any = None) -> None:
        """Block until all work queued on ``device`` has finished."""

    def _index(self, device: Any) -> int:
        """Device index of ``device`` (index, ``torch.device`` with or without index, None: current)."""
        if device is None:
            return self.current_device()
        if isinstance(device, torch.device):
            return device.index if device.index is not None else self.current_device()
        return int(device)

    def supports_dtype(self, dtype: torch.dtype, device: Any = None) -> bool:
        """True when ``device`` (None: the current one) computes ``dtype`` natively (a silent downcast
        is not native)."""
        return dtype_name(dtype) in self.device_properties(self._index(device)).dtypes

    # ---- memory -------------------------------------------------------------------------------
    def allocate(self, shape: Sequence[int], dtype: torch.dtype = torch.float32, device: Any = None) -> torch.Tensor:
        """An uninitialised tensor on the device. The caller owns it; freed when unreferenced."""
        return torch.empty(tuple(shape), dtype=dtype, device=self.torch_device(device))

    def to_device(self, host: Any, device: Any = None, *, stream: Optional[Stream] = None) -> torch.Tensor:
        """Copy a host tensor or numpy array to the device (asynchronously when ``stream`` is given
        and the host memory is pinned; the caller synchronizes the stream before reading)."""
        t = host if isinstance(host, torch.Tensor) else torch.as_tensor(host)
        target = self.torch_device(device)
        with self.use_stream(stream) if stream is not None else contextlib.nullcontext():
            return t.to(target, non_blocking=stream is not None)

    def to_host(self, tensor: torch.Tensor, *, stream: Optional[Stream] = None) -> torch.Tensor:
        """Copy a device tensor to host memory. Synchronous unless ``stream`` is given."""
        with self.use_stream(stream) if stream is not None else contextlib.nullcontext():
            return tensor.to("cpu", non_blocking=stream is not None)

    def copy(self, dst: torch.Tensor, src: torch.Tensor, *, stream: Optional[Stream] = None) -> torch.Tensor:
        """``dst.copy_(src)`` ordered on ``stream`` (or the current stream); returns ``dst``."""
        with self.use_stream(stream) if stream is not None else contextlib.nullcontext():
            return dst.copy_(src, non_blocking=stream is not None)

    @abc.abstractmethod
    def memory_stats(self, device: Any = None) -> MemoryStats:
        """Allocator statistics for ``device``."""

    @abc.abstractmethod
    def reset_peak_memory_stats(self, device: Any = None) -> None:
        """Make ``peak`` equal the current allocation from now on."""

    def empty_cache(self) -> None:
        """Release cached, unused device memory back to the driver (no-op where nothing is cached)."""

    # ---- streams and events ---------------------------------------------------------------------
    @abc.abstractmethod
    def create_stream(self, device: Any = None, priority: int = 0) -> Stream:
        """A new stream on ``device``. Never None."""

    @abc.abstractmethod
    def current_stream(self, device: Any = None) -> Stream:
        """The stream work is queued on now."""

    @abc.abstractmethod
    def create_event(self, enable_timing: bool = False) -> Event:
        """A new event. Never None."""

    @contextlib.contextmanager
    def use_stream(self, stream: Stream) -> Iterator[Stream]:
        """Make ``stream`` current inside the ``with`` block."""
        with stream:
            yield stream

    # ---- RNG ------------------------------------------------------------------------------------
    # Defaults are the host generator's (the CPU); device backends seed the device's own generator.
    def manual_seed(self, seed: int, device: Any = None) -> None:
        """Seed the default random generator of ``device`` (None: the current device) only."""
        torch.default_generator.manual_seed(int(seed))

    def get_rng_state(self, device: Any = None) -> torch.Tensor:
        """The default generator's state of ``device`` as a host ``uint8`` tensor (for checkpoints)."""
        return torch.get_rng_state()

    def set_rng_state(self, state: torch.Tensor, device: Any = None) -> None:
        """Restore a state returned by :meth:`get_rng_state` on the same backend and device."""
        torch.set_rng_state(state)

    def generator(self, seed: Optional[int] = None, device: Any = None) -> torch.Generator:
        """A new ``torch.Generator`` on ``device`` (seeded when ``seed`` is given), independent of the default."""
        gen = torch.Generator(device=self.torch_device(device))
        if seed is not None:
            gen.manual_seed(int(seed))
        return gen

    # ---- environment ----------------------------------------------------------------------------
    @classmethod
    def env_map(cls) -> dict[str, Optional[str]]:
        """``{CUDA variable: this backend's counterpart}`` (None: no counterpart; setting it does nothing).

        Data, not code: the backend's ``env_map_file`` (``CUDA_NAME<TAB>OWN_NAME`` rows, ``#`` comments,
        an empty second column for "none"). Empty when the backend ships no such file."""
        path = cls.data_file(cls.env_map_file)
        out: dict[str, Optional[str]] = {}
        if path is None:
            return out
        for line in path.read_text(encoding="utf-8").splitlines():
            if not line.strip() or line.startswith("#"):
                continue
            cuda, _, own = line.partition("\t")
            out[cuda.strip()] = own.strip() or None
        return out

    @classmethod
    def translate_env(cls, environ: Mapping[str, str]) -> dict[str, str]:
        """The CUDA variables set in ``environ`` renamed to this backend's counterparts (others dropped)."""
        table = cls.env_map()
        return {table[k]: v for k, v in environ.items() if table.get(k)}

    @classmethod
    def visible_devices(cls, environ: Optional[Mapping[str, str]] = None) -> Optional[list[str]]:
        """Devices named in :attr:`visible_devices_env` (None: unset or no such variable, all visible)."""
        env = os.environ if environ is None else environ
        value = env.get(cls.visible_devices_env) if cls.visible_devices_env else None
        if value is None:
            return None
        return [p.strip() for p in value.split(",") if p.strip()]

    @classmethod
    def restrict_devices_env(cls, devices: Sequence[Any], environ: Optional[Mapping[str, str]] = None
                             ) -> dict[str, str]:
        """A copy of ``environ`` (default ``os.environ``) for a child process that sees only ``devices``.

        Raises NotSupportedError when the backend has no visible-devices variable (e.g. the CPU)."""
        if not cls.visible_devices_env:
            raise NotSupportedError("restrict_devices_env", cls.name, ["the backend has no visible-devices variable"])
        env = dict(os.environ if environ is None else environ)
        env[cls.visible_devices_env] = ",".join(str(d) for d in devices)
        return env

    # ---- collectives ------------------------------------------------------------------------------
    def check_reduce_op(self, op: str) -> None:
        """Raise NotSupportedError before any call when the collective library lacks ``op``."""
        if op.upper() in self.unsupported_reduce_ops:
            raise NotSupportedError(f"ReduceOp.{op.upper()}", self.name,
                                    [f"{self.dist_backend} does not implement it"])

    # ---- ops --------------------------------------------------------------------------------------
    def register_ops(self, registry: "Any") -> None:
        """Register this backend's op implementations into ``registry`` (called once, lazily)."""

    # ---- misc -------------------------------------------------------------------------------------
    def autocast(self, dtype: torch.dtype = torch.bfloat16, enabled: bool = True):
        """``torch.autocast`` for this device type."""
        return torch.autocast(self.device_type, dtype=dtype, enabled=enabled)

    def describe(self) -> dict:
        """Plain data for reports: identity, devices and versions."""
        return {
            "name": self.name,
            "device_type": self.device_type,
            "priority": self.priority,
            "dist_backend": self.dist_backend,
            "devices": [d.as_dict() for d in self.devices()],
            "versions": self.versions(),
        }
