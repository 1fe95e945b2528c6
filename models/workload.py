"""The interface every reference workload implements (:class:`Workload`), and device resolution.

A workload owns one model and its optimizer on one device. Life cycle::

    w = get_workload("gpt", config="tiny")      # config only, nothing allocated
    w.build(device="cpu", dtype=torch.float32, seed=0)
    batch = w.example_batch()                   # deterministic from the seed (and ``index``)
    loss = w.train_step(batch)                  # forward, loss, backward, optimizer step
    out = w.infer(batch)                        # eval-mode inference

Determinism: parameters are initialised on the host from ``seed`` in float32 and then moved to the
device and cast, so every backend and dtype starts from the same weights; batches come from a host
``torch.Generator`` seeded from ``(seed, index)``. Dtype: ``bfloat16``/``float16`` mean the
*parameters themselves* are in that dtype (no autocast); optimizer state follows the parameters.

Checkpoints (:meth:`Workload.state_dict`) hold host tensors only, so a checkpoint saved on one
backend loads on another; they include the step count, optimizer state and the RNG states
(host RNG, the device's RNG where torch exposes one, and dropout-free data sampling is keyed by
``index`` so it needs no state). Not thread-safe: one thread drives a workload.
"""
from __future__ import annotations

import abc
import dataclasses
import os
from typing import Any, ClassVar, Mapping, Optional

import torch

from hal.backend import Backend, dtype_name
from hal.errors import HalError

CHECKPOINT_FORMAT = "hal-models-checkpoint/1"
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
           "float64": torch.float64}


def parse_dtype(dtype: "torch.dtype | str") -> torch.dtype:
    """``"bfloat16"``/``torch.bfloat16`` -> ``torch.bfloat16``; ValueError naming the choices."""
    if isinstance(dtype, torch.dtype):
        return dtype
    name = str(dtype).replace("torch.", "")
    if name not in _DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; one of {', '.join(_DTYPES)}")
    return _DTYPES[name]


def resolve_device(device: Any = None) -> tuple[torch.device, Optional[Backend], str]:
    """Map ``device`` (None, a backend name such as ``"cpu"``, ``"<type>:<index>"`` or a
    ``torch.device``) to ``(torch.device, backend or None, reason)``.

    The backend comes from HAL discovery. When no available HAL backend serves that device type
    (a plugin still being written, say), the torch device is still returned with ``backend=None``
    and ``reason`` saying why, so training runs but memory statistics are reported unavailable.
    Raises ValueError for a device string torch does not understand.
    """
    import hal
    if device is None:
        backend = hal.get_backend()
        return backend.torch_device(), backend, ""
    if isinstance(device, str):
        try:
            tdev = torch.device(device)
        except RuntimeError as exc:
            raise ValueError(f"unknown device {device!r}: {exc}") from None
    elif isinstance(device, torch.device):
        tdev = device
    else:
        raise ValueError(f"device must be a name or torch.device, not {type(device).__name__}")
    try:
        backend = hal.backend_for_device_type(tdev.type)
    except HalError as exc:
        return tdev, None, str(exc)
    if tdev.type != "cpu" and tdev.index is None:
        tdev = backend.torch_device(backend.current_device())
    return tdev, backend, ""


def synchronize(device: torch.device, backend: Optional[Backend]) -> None:
    """Wait for queued work on ``device`` (through the backend; torch's module as a fallback)."""
    if device.type == "cpu":
        return
    if backend is not None:
        backend.synchronize(device)
        return
    mod = getattr(torch, device.type, None)
    if mod is not None and hasattr(mod, "synchronize"):
        mod.synchronize(device)


def _device_rng(device: torch.device, backend: Optional[Backend]) -> Optional[Backend]:
    """The HAL backend that owns ``device``'s random generator (None: the host generator is the only one)."""
    return backend if backend is not None and device.type != "cpu" else None


@dataclasses.dataclass(frozen=True)
class BaseConfig:
    """Fields every workload config has. Subclasses add the model's own."""

    batch_size: int = 4

    def replace(self, **overrides: Any) -> "BaseConfig":
        names = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(overrides) - names)
        if unknown:
            raise ValueError(f"unknown config field(s) {', '.join(unknown)}; valid: {', '.join(sorted(names))}")
        return dataclasses.replace(self, **overrides)


class Workload(abc.ABC):
    """One reference workload. See the module docstring for the life cycle and guarantees.

    Subclasses define ``name``, ``CONFIGS`` and the ``_make_*`` / ``_loss`` / ``infer`` /
    ``estimates`` methods. Methods other than ``__init__`` raise RuntimeError before :meth:`build`.
    """

    name: ClassVar[str]
    CONFIGS: ClassVar[Mapping[str, BaseConfig]]
    DEFAULT_CONFIG: ClassVar[str] = "tiny"

    def __init__(self, config: "str | BaseConfig" = "tiny", **overrides: Any):
        if isinstance(config, BaseConfig):
            cfg, self.config_name = config, "custom"
        else:
            if config not in self.CONFIGS:
                raise ValueError(f"unknown {self.name} config {config!r}; one of {', '.join(self.CONFIGS)}")
            cfg, self.config_name = self.CONFIGS[config], config
        self.config = cfg.replace(**overrides) if overrides else cfg
        self.model: Optional[torch.nn.Module] = None
        self.optimizer: Optional[torch.optim.Optimizer] = None
        self.device: Optional[torch.device] = None
        self.backend: Optional[Backend] = None
        self.backend_reason = ""
        self.dtype: torch.dtype = torch.float32
        self.seed = 0
        self.step = 0

    # ---- to implement ---------------------------------------------------------------------
    @abc.abstractmethod
    def _make_model(self) -> torch.nn.Module:
        """A fresh model in float32 on the host (parameters drawn from the global RNG)."""

    @abc.abstractmethod
    def _make_optimizer(self, params: Any) -> torch.optim.Optimizer:
        """The optimizer over ``params``."""

    @abc.abstractmethod
    def _make_batch(self, batch_size: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
        """A host batch drawn from ``gen``."""

    @abc.abstractmethod
    def _loss(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Forward pass and scalar loss in train mode."""

    @abc.abstractmethod
    def infer(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Eval-mode inference under ``torch.no_grad``."""

    @abc.abstractmethod
    def estimates(self, batch_size: Optional[int] = None, seq_len: Optional[int] = None) -> dict:
        """``{"parameters", "flops_per_step", "memory": {..., "total_bytes", "lower_bound"}}``."""

    def onnx_inputs(self, batch: Mapping[str, torch.Tensor]) -> tuple[torch.nn.Module, tuple, list[str]]:
        """``(module, example args, input names)`` of the inference path for ONNX export."""
        raise NotImplementedError

    # ---- provided -----------------------------------------------------------------------------
    def build(self, device: Any = None, dtype: "torch.dtype | str" = torch.float32, seed: int = 0) -> "Workload":
        """Create ``model`` and ``optimizer`` on ``device`` in ``dtype`` from ``seed``; returns self.

        Reseeds torch's global host RNG (and the device's) with ``seed``, so dropout is reproducible.
        Raises ValueError for an unknown device or dtype."""
        self.device, self.backend, self.backend_reason = resolve_device(device)
        self.dtype = parse_dtype(dtype)
        self.seed = int(seed)
        torch.manual_seed(self.seed)
        model = self._make_model()
        self.model = model.to(device=self.device, dtype=self.dtype)
        self.optimizer = self._make_optimizer(self.model.parameters())
        self.step = 0
        torch.manual_seed(self.seed)  # the same RNG stream (dropout) wherever build happened
        rng = _device_rng(self.device, self.backend)
        if rng is not None:
            rng.manual_seed(self.seed, self.device)
        return self

    def _require_built(self) -> None:
        if self.model is None:
            raise RuntimeError(f"{self.name}: call build() first")

    def example_batch(self, batch_size: Optional[int] = None, index: int = 0) -> dict[str, torch.Tensor]:
        """Batch number ``index``, deterministic from ``(seed, index)``, on ``self.device``."""
        self._require_built()
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + int(index))
        host = self._make_batch(int(batch_size or self.config.batch_size), gen)
        return {k: v.to(self.device, dtype=self.dtype if v.is_floating_point() else v.dtype)
                for k, v in host.items()}

    def forward_loss(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Forward pass and loss (train mode, graph kept), no backward."""
        self._require_built()
        self.model.train()
        return self._loss(batch)

    def backward(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Forward, loss and backward (gradients left in ``.grad``); returns the detached loss."""
        loss = self.forward_loss(batch)
        loss.backward()
        return loss.detach()

    def optimizer_step(self) -> None:
        """Optimizer step, ``zero_grad(set_to_none=True)``, and ``step += 1``."""
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1

    def train_step(self, batch: Mapping[str, torch.Tensor]) -> float:
        """Forward, loss, backward, optimizer step, zero_grad; returns the loss as a float."""
        loss = self.backward(batch)
        self.optimizer_step()
        return float(loss)

    def synchronize(self) -> None:
        synchronize(self.device, self.backend)

    def optimizer_foreach(self) -> bool:
        """Whether torch's optimizer will use its multi-tensor (foreach) path on this device
        (torch's own default rule; affects the optimizer's temporary memory)."""
        if self.model is None or self.device is None:
            return False
        try:
            from torch.optim.optimizer import _default_to_fused_or_foreach
            params = [p for p in self.model.parameters()]
            return bool(_default_to_fused_or_foreach(params, differentiable=False, use_fused=False)[1])
        except Exception:  # private API moved: torch uses foreach on accelerators, not on the CPU
            return self.device.type != "cpu"

    def parameter_count(self) -> int:
        self._require_built()
        return sum(p.numel() for p in self.model.parameters())

    # ---- checkpoints ----------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Everything needed to resume bitwise: model, optimizer, step, RNG states (host tensors)."""
        self._require_built()
        rng = _device_rng(self.device, self.backend)
        return {
            "format": CHECKPOINT_FORMAT, "workload": self.name, "config": dataclasses.asdict(self.config),
            "dtype": dtype_name(self.dtype), "seed": self.seed, "step": self.step,
            "saved_on": str(self.device),
            "model": {k: v.detach().to("cpu") for k, v in self.model.state_dict().items()},
            "optimizer": _to_host(self.optimizer.state_dict()),
            "rng": {"host": torch.get_rng_state(),
                    "device": rng.get_rng_state(self.device) if rng is not None else None},
        }

    def load_state_dict(self, sd: Mapping[str, Any]) -> None:
        """Restore a :meth:`state_dict` (from any backend) onto this workload's device.

        Raises ValueError when the checkpoint belongs to another workload or config."""
        self._require_built()
        if sd.get("format") != CHECKPOINT_FORMAT or sd.get("workload") != self.name:
            raise ValueError(f"not a {self.name} checkpoint (format {sd.get('format')!r}, "
                             f"workload {sd.get('workload')!r})")
        if sd["config"] != dataclasses.asdict(self.config):
            raise ValueError(f"checkpoint config {sd['config']} differs from this workload's {dataclasses.asdict(self.config)}")
        self.model.load_state_dict(sd["model"])
        self.optimizer.load_state_dict(sd["optimizer"])  # moves state to the parameters' device
        self.step = int(sd["step"])
        torch.set_rng_state(sd["rng"]["host"])
        rng = _device_rng(self.device, self.backend)
        if rng is not None and sd["rng"].get("device") is not None and str(self.device) == sd.get("saved_on"):
            rng.set_rng_state(sd["rng"]["device"], self.device)

    def save(self, path: "str | os.PathLike") -> None:
        """Write :meth:`state_dict` to ``path`` with ``torch.save``."""
        torch.save(self.state_dict(), path)

    def resume(self, path: "str | os.PathLike") -> None:
        """Load a checkpoint written by :meth:`save` (on any backend) into this built workload."""
        self.load_state_dict(torch.load(path, map_location="cpu", weights_only=False))

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}:{self.config_name} device={self.device} dtype={self.dtype}>"


def _to_host(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu")
    if isinstance(obj, dict):
        return {k: _to_host(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_host(v) for v in obj)
    return obj
