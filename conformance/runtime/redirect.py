"""Run a CUDA program on a machine without CUDA: send every CUDA use to the device that is present.

Used only inside the audit's child process, only while the audited program runs. The program
should take its real CUDA code path (so the audit sees its real op mix), so:

- device arguments (``"cuda"``, ``"cuda:N"``, ``torch.device("cuda")``, an int passed to ``.to``)
  of factory functions, ``.to()``, ``.cuda()`` and ``Module.cuda()`` are rewritten to the present
  device by a ``TorchFunctionMode``; ``.pin_memory()`` becomes a no-op;
- every name of ``torch.cuda.__all__`` is a stand-in, left as is, or deliberately unsupported
  (:mod:`.cuda_api`, by construction from the running torch): ``is_available()`` answers True,
  ``device_count()`` 1 (``--devices N``: N, each of them the present device; ``set_device`` / ``current_device``
  keep and answer the index the program set), Stream/Event/device stay classes that subclass what torch checks against;
- ``torch.load(map_location=...)`` (strings, ``torch.device``, dicts, callables, and None for a
  checkpoint saved on a GPU) and ``torch.set_default_device("cuda")`` use the present device;
- ``torch.compile`` returns the model unchanged (eager: the captured ops are the eager program's),
  CUDA graphs run their captured work eagerly once; both are recorded as findings;
- ``torch.cuda.amp.autocast`` / ``torch.autocast("cuda")`` autocast on the present device
  (bfloat16 on the CPU: a dtype change, reported as a warning);
- ``torch.cuda.amp.GradScaler`` / ``torch.amp.GradScaler("cuda")`` become disabled scalers;
- ``torch.distributed.init_process_group("nccl")`` uses gloo, and DDP drops CUDA ``device_ids``;
- ``torch.accelerator`` (torch >= 2.6) answers like that CUDA machine (:mod:`.cuda_api`,
  complete by construction too);
- ``nn.DataParallel`` runs its module as a single replica on the CPU (torch's own no-GPU path);
- ``torch.Generator("cuda")`` makes a CPU generator (``isinstance`` still holds for real ones).

Every redirect is recorded once per (rule, source line) with a count, as a finding whose path and
line are the first stack frame outside torch, HAL and the standard library (the user's line).
:meth:`DeviceRedirect.install` patches process-global state; :meth:`remove` restores it. Not
thread-safe to install/remove concurrently; recording takes no lock (CPython dict updates).
"""
from __future__ import annotations

import contextlib
import os
import sys
import sysconfig
from typing import Any, Callable, Optional

import torch
from torch.overrides import TorchFunctionMode



def _package_dirs() -> set[str]:
    """Directories of torch, the standard library and every folder of the ``hal`` import root."""
    import importlib.util
    dirs = {os.path.dirname(torch.__file__), sysconfig.get_paths()["stdlib"]}
    for name in ("hal", "hal.conformance", "hal.backends", "hal.models"):
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        if spec is not None and spec.submodule_search_locations:
            dirs.update(spec.submodule_search_locations)
    return dirs


_SKIP_DIRS = tuple(os.path.realpath(p) + os.sep for p in _package_dirs())
_HAL_DIRS = tuple(p for p in _SKIP_DIRS if p != os.path.realpath(os.path.dirname(torch.__file__)) + os.sep
                  and p != os.path.realpath(sysconfig.get_paths()["stdlib"]) + os.sep)

RULES = {
    "runtime-redirect-cuda-device": ("info", "CUDA device use ran on {dev} during the audit",
                                     "use the target device (e.g. torch.device('mlu')) or hal.get_backend().torch_device()"),
    "runtime-redirect-cuda-available": ("info", "torch.cuda.is_available() answered True during the audit so the "
                                        "program took its CUDA path (it ran on {dev})",
                                        "test the target's availability (torch.mlu.is_available()) or use hal.get_backend()"),
    "runtime-redirect-cuda-api": ("info", "torch.cuda.{what} was replaced by a stand-in during the audit",
                                  "call the target's module (torch.mlu.{what}) or the HAL backend's equivalent"),
    "runtime-redirect-autocast": ("warning", "CUDA autocast ran as {dev} autocast in {dtype} during the audit "
                                  "(the dtype the program asked for: {asked})",
                                  "use torch.autocast(device_type=<target>) with a dtype the target supports"),
    "runtime-redirect-grad-scaler": ("info", "a GradScaler for CUDA was created; during the audit it ran on {dev} "
                                     "(enabled only where the audit predicts the target's paths or compares precision)",
                                     "use torch.amp.GradScaler(<target>) (torch_mlu supports 'mlu')"),
    "runtime-redirect-nccl": ("warning", "init_process_group({asked!r}) used gloo during the audit",
                                "use the target's collective backend (cncl on MLU) or hal.collectives"),
    "runtime-redirect-pin-memory": ("info", "pin_memory() was skipped during the audit (no CUDA host allocator)",
                                    "pin memory through the target (torch_mlu supports pin_memory) or HAL memory"),
    "runtime-redirect-cuda-graph": ("warning", "a CUDA graph ran eagerly on {dev} during the audit (captured work ran "
                                   "once; replay() did not re-run it)",
                                   "check that the target supports graph capture (torch.mlu.MLUGraph) or run eagerly"),
    "runtime-redirect-compile": ("info", "torch.compile ran eagerly during the audit: the ops shown are the eager "
                                 "program's, not the compiled kernels",
                                 "check the target's torch.compile backend (torch_mlu ships one) on the device"),
    "runtime-redirect-device-mesh": ("info", "DeviceMesh({asked!r}, ...) was made as a {dev} mesh during the audit "
                                     "(its DTensors, and FSDP over it, on {dev})",
                                     "make the mesh for the target: init_device_mesh('mlu', ...) (torch_mlu r2.4 lists "
                                     "DeviceMesh and init_device_mesh as supported)"),
    "runtime-redirect-ddp-device-ids": ("info", "DistributedDataParallel device_ids={asked} were dropped on {dev}",
                                        "pass the target's device index (device_ids=[local_rank] with torch.mlu)"),
    "runtime-redirect-accelerator": ("warning", "torch.accelerator.{what}() answered as a CUDA machine of {gpus} "
                                     "GPU(s) during the audit (the program ran on {dev})",
                                     "torch.accelerator exists from torch 2.6 on; the torch_mlu releases in the "
                                     "reference (1.22, up to torch 2.4) have none, so this line raises AttributeError "
                                     "there: use torch.mlu / hal.get_backend(), or fall back when "
                                     "hasattr(torch, 'accelerator') is False"),
    "runtime-redirect-data-parallel": ("warning", "nn.DataParallel(device_ids={asked}) ran its module as a single "
                                       "replica on {dev} during the audit (no scatter, replicate or gather)",
                                       "use DistributedDataParallel with one process per MLU and the cncl backend "
                                       "(hal.collectives): old torch_mlu needed its own MLUDataParallel, and "
                                       "DataParallel's multi-device scatter/replicate is not verified on MLU"),
    "runtime-redirect-generator": ("info", "torch.Generator(device={asked!r}) made a {dev} generator during the audit",
                                   "make the generator on the target (torch.Generator('mlu'); torch_mlu converts it "
                                   "to a CPU generator for some ops)"),
}


def user_frame() -> tuple[str, int]:
    """``(path, line)`` of the innermost frame outside torch, HAL and the standard library."""
    f = sys._getframe(1)
    fallback = ("", 0)
    while f is not None:
        path = f.f_code.co_filename
        if not path.startswith("<"):
            real = os.path.realpath(path)
            if not real.startswith(_SKIP_DIRS) and "site-packages" not in real:
                return path, f.f_lineno
            if not fallback[0] and not real.startswith(_HAL_DIRS):  # a thread torch started: torch's line
                fallback = (path, f.f_lineno)
        f = f.f_back
    return fallback


def headwise_attention(sdpa: Callable[..., Any], query: Any, key: Any, value: Any, args: tuple, kwargs: dict) -> Any:
    """``sdpa(query, key, value, *args, **kwargs)`` of DTensors computed on each rank's local tensors and returned as a
    DTensor of the query's layout, when that is the same attention: the three of one mesh and one layout, 4-D, each
    placement a shard of dimension 0 (batch) or 1 (heads) or a replica, no mask (keyword arguments only). None
    otherwise (plain tensors, a sequence-sharded layout, a mask): the caller runs ``sdpa`` itself. Differentiable
    (``to_local`` and ``from_local`` are)."""
    ts = (query, key, value)
    if args or kwargs.get("attn_mask") is not None or not all(hasattr(type(t), "_local_tensor") for t in ts):
        return None
    if any(t.device_mesh != query.device_mesh or tuple(t.placements) != tuple(query.placements) or t.dim() != 4
           for t in ts):
        return None
    if not all(p.is_replicate() or p.is_shard(0) or p.is_shard(1) for p in query.placements):
        return None
    out = sdpa(query.to_local(), key.to_local(), value.to_local(), **kwargs)
    return type(query).from_local(out, query.device_mesh, query.placements, run_check=False)


def _is_cuda(dev: Any) -> bool:
    if isinstance(dev, torch.device):
        return dev.type == "cuda"
    if isinstance(dev, str):
        return dev == "cuda" or dev.startswith("cuda:")
    return False


class DeviceRedirect(TorchFunctionMode):
    """See the module docstring. ``device``: the device type that is present (``"cpu"`` here); ``devices``: how many
    CUDA devices the program is told there are (``--devices``, default 1; each is ``device``)."""

    def __init__(self, device: str = "cpu", autocast_dtype: Optional[torch.dtype] = None,
                 devices: Optional[int] = None) -> None:
        super().__init__()
        self.device = device
        self.devices = devices or 1
        #: the index the program set last (``torch.cuda.set_device``), what ``current_device()`` answers
        self.current_index = 0
        self.autocast_dtype = autocast_dtype or (torch.bfloat16 if device == "cpu" else torch.float16)
        self.records: dict[tuple[str, str, int], dict] = {}
        self._saved: list[tuple[Any, str, Any]] = []
        self._quiet = 0
        self.stand_ins: dict[str, Any] = {}

    # -- recording -------------------------------------------------------------------------------
    def record(self, rule: str, **fmt: Any) -> None:
        path, line = user_frame()
        key = (rule, path, line)
        rec = self.records.get(key)
        if rec is None:
            severity, message, fix = RULES[rule]
            fmt.setdefault("dev", self.device)
            fmt.setdefault("gpus", self.devices)
            self.records[key] = {"rule": rule, "path": path, "line": line, "severity": severity,
                                 "message": message.format(**fmt), "fix": fix.format(**fmt), "count": 1}
        else:
            rec["count"] += 1

    def findings(self) -> list[dict]:
        return sorted(self.records.values(), key=lambda r: (r["path"], r["line"], r["rule"]))

    # -- device arguments ------------------------------------------------------------------------
    def __torch_function__(self, func: Callable, types: Any, args: tuple = (), kwargs: Optional[dict] = None) -> Any:
        kwargs = kwargs or {}
        dev = kwargs.get("device")
        if dev is not None and _is_cuda(dev):
            kwargs = dict(kwargs, device=self.device)
            self.record("runtime-redirect-cuda-device")
        if func is _TENSOR_CUDA:
            self.record("runtime-redirect-cuda-device")
            kwargs.pop("device", None)
            return args[0].to(self.device, **{k: v for k, v in kwargs.items() if k in ("non_blocking", "memory_format")})
        if func is _TENSOR_PIN:
            self.record("runtime-redirect-pin-memory")
            return args[0]
        if kwargs.get("pin_memory"):
            kwargs = dict(kwargs, pin_memory=False)
            self.record("runtime-redirect-pin-memory")
        if func is _PARSE_TO and args and (_is_cuda(args[0]) or (isinstance(args[0], int)
                                                                and not isinstance(args[0], bool))):
            args = (self.device, *args[1:])  # Module.to(0) / Module.to("cuda"): an int is the accelerator
            self.record("runtime-redirect-cuda-device")
        if func is _TENSOR_TO and len(args) > 1:
            first = args[1]
            if _is_cuda(first) or (isinstance(first, int) and not isinstance(first, bool)):
                args = (args[0], self.device, *args[2:])
                self.record("runtime-redirect-cuda-device")
        return func(*args, **kwargs)

    # -- torch.cuda, amp, distributed ------------------------------------------------------------
    def _patch(self, owner: Any, name: str, value: Any) -> None:
        if not hasattr(owner, name):
            return
        self._saved.append((owner, name, getattr(owner, name)))
        setattr(owner, name, value)

    def _api(self, what: str, result: Any = None) -> Callable[..., Any]:
        def stand_in(*_a: Any, **_k: Any) -> Any:
            self.api_call(what)
            return result() if callable(result) else result
        stand_in.__name__ = what
        return stand_in

    def api_call(self, what: str, rule: str = "runtime-redirect-cuda-api") -> None:
        """Record ``torch.cuda.<what>`` (``rule`` runtime-redirect-accelerator: ``torch.accelerator.<what>``)
        as a finding when the program itself made the call (the stand-in's caller is not torch)."""
        if self._quiet == 0 and self.called_by_program(depth=3):
            self.record(rule, what=what)

    @staticmethod
    def called_by_program(depth: int = 2) -> bool:
        """True when the frame ``depth`` levels up (the stand-in's caller) is outside torch, HAL and
        the standard library: the program (or a library it uses) made the call, not torch itself."""
        try:
            f = sys._getframe(depth)
        except ValueError:
            return True
        path = f.f_code.co_filename
        return path.startswith("<") or not os.path.realpath(path).startswith(_SKIP_DIRS)

    @contextlib.contextmanager
    def quiet(self) -> Any:
        """Stand-ins called from inside another stand-in record nothing."""
        self._quiet += 1
        try:
            yield
        finally:
            self._quiet -= 1

    def install(self) -> None:
        from hal.conformance.runtime import cuda_api
        self.stand_ins = cuda_api.install(self)
        self.stand_ins.update({f"accelerator.{k}": v for k, v in cuda_api.install_accelerator(self).items()})
        nvtx = getattr(torch.cuda, "nvtx", None)
        if nvtx is not None:
            for name, result in [("range_push", 0), ("range_pop", 0), ("mark", None),
                                 ("range", contextlib.nullcontext)]:
                self._patch(nvtx, name, self._api(f"nvtx.{name}", result))
        self._install_pin_memory()
        self._install_default_device()
        self._install_load()
        self._install_compile()
        self._install_amp()
        self._install_distributed()
        self._install_attention()
        self._install_data_parallel()
        self._install_generator()
        self._install_backward()
        self.__enter__()

    def _install_backward(self) -> None:
        """The backward pass runs the program's code (custom autograd Functions' ``backward``, tensor hooks; DTensor's
        ``from_local`` moves a gradient to the mesh's device type), but ``Tensor.backward``, ``torch.autograd.grad``
        and on torch >= 2.5 ``torch.autograd.backward`` dispatch to this mode first, and a mode's handler runs with the
        mode off: their CUDA calls escaped the redirect ("PyTorch is not linked with support for cuda devices",
        pytorch/examples tensor_parallelism). The engine call they all end in runs with this mode back on, where it
        is off."""
        from torch.overrides import _get_current_function_mode_stack
        real = torch.autograd._engine_run_backward
        redirect = self

        def engine_run_backward(*args: Any, **kwargs: Any) -> Any:
            if redirect in _get_current_function_mode_stack():
                return real(*args, **kwargs)
            with redirect:
                return real(*args, **kwargs)
        engine_run_backward.__wrapped__ = real  # type: ignore[attr-defined]
        self._patch(torch.autograd, "_engine_run_backward", engine_run_backward)

    def _install_generator(self) -> None:
        """``torch.Generator("cuda")`` / ``torch.Generator(device=torch.device("cuda", 1))`` make a
        generator on the present device. ``torch.Generator`` becomes a subclass whose metaclass answers
        isinstance/issubclass for every real generator (``torch.default_generator``, a DataLoader's)."""
        if self.device != "cpu":
            return
        real = torch.Generator
        redirect = self

        class _GeneratorMeta(type(real)):  # type: ignore[misc]
            def __instancecheck__(cls, obj: Any) -> bool:
                return isinstance(obj, real)

            def __subclasscheck__(cls, sub: type) -> bool:
                return issubclass(sub, real)

        def __new__(cls: type, device: Any = "cpu") -> Any:
            if _is_cuda(device) or (isinstance(device, int) and not isinstance(device, bool)):
                redirect.record("runtime-redirect-generator", asked=str(device))
                device = redirect.device
            return real.__new__(cls, device)

        generator = _GeneratorMeta("Generator", (real,), {
            "__new__": __new__, "__init__": lambda self, device="cpu": None, "__module__": "torch",
            "__doc__": "Audit stand-in for torch.Generator: a CUDA generator is made on the present device."})
        self._patch(torch, "Generator", generator)

    def _install_data_parallel(self) -> None:
        """``nn.DataParallel`` (and ``nn.parallel.data_parallel``) run the module as one replica on the
        present device: their device-type probe answers None, which is torch's own no-GPU path."""
        import importlib
        dp_mod = importlib.import_module("torch.nn.parallel.data_parallel")  # the package attribute is the function
        if self.device != "cpu" or not hasattr(dp_mod, "_get_available_device_type"):
            return
        redirect = self
        real_init = dp_mod.DataParallel.__init__

        def dp_init(module_self: Any, module: Any, device_ids: Any = None, *args: Any, **kwargs: Any) -> None:
            redirect.record("runtime-redirect-data-parallel", asked=device_ids)
            real_init(module_self, module, device_ids, *args, **kwargs)

        def data_parallel(module: Any, inputs: Any, device_ids: Any = None, output_device: Any = None, dim: int = 0,
                          module_kwargs: Any = None) -> Any:
            # torch's functional form raises without a device type: run it as the one-device case does
            redirect.record("runtime-redirect-data-parallel", asked=device_ids)
            if not isinstance(inputs, tuple):
                inputs = (inputs,) if inputs is not None else ()
            return module(*inputs, **(module_kwargs or {}))

        self._patch(dp_mod, "_get_available_device_type", lambda: None)
        self._patch(dp_mod.DataParallel, "__init__", dp_init)
        self._patch(dp_mod, "data_parallel", data_parallel)
        self._patch(torch.nn.parallel, "data_parallel", data_parallel)

    def _install_default_device(self) -> None:
        real = torch.set_default_device
        redirect = self

        def set_default_device(device: Any) -> None:
            if _is_cuda(device) or (isinstance(device, int) and not isinstance(device, bool)):
                redirect.record("runtime-redirect-cuda-device")
                device = redirect.device
            real(device)

        self._patch(torch, "set_default_device", set_default_device)

    def _map_location(self, loc: Any) -> Any:
        """``torch.load``'s map_location with every CUDA target sent to the present device."""
        from torch.serialization import default_restore_location
        dev = self.device
        redirect = self
        if loc is None or callable(loc) and not isinstance(loc, (str, torch.device)):
            user = loc

            def restore(storage: Any, location: str) -> Any:
                if user is not None:
                    try:
                        out = user(storage, location)
                    except Exception:
                        out = None  # a CUDA-only callable (storage.cuda()) on a machine without CUDA
                    if out is not None and not (hasattr(out, "device") and getattr(out.device, "type", "") == "cuda"):
                        return out
                if str(location).startswith("cuda"):
                    redirect.record("runtime-redirect-cuda-device")
                    return default_restore_location(storage, dev)
                return None if user is None else default_restore_location(storage, location)
            return restore
        if isinstance(loc, dict):
            out = {}
            for k, v in loc.items():
                if _is_cuda(v):
                    v = dev
                    self.record("runtime-redirect-cuda-device")
                out[k] = v
            return out
        if _is_cuda(loc) or (isinstance(loc, int) and not isinstance(loc, bool)):
            self.record("runtime-redirect-cuda-device")
            return dev
        return loc

    def _install_load(self) -> None:
        import torch.serialization as ser
        real = ser.load
        redirect = self

        def load(f: Any, map_location: Any = None, *args: Any, **kwargs: Any) -> Any:
            return real(f, redirect._map_location(map_location), *args, **kwargs)

        load.__doc__ = real.__doc__
        self._patch(torch, "load", load)
        self._patch(ser, "load", load)

    def _install_compile(self) -> None:
        redirect = self

        def compile(model: Any = None, *args: Any, **kwargs: Any) -> Any:  # noqa: A001 - torch's name
            redirect.record("runtime-redirect-compile")
            if model is None:
                return lambda m: m
            return model

        self._patch(torch, "compile", compile)

    def _install_pin_memory(self) -> None:
        """DataLoader pins in its own thread (where the TorchFunctionMode is not active)."""
        try:
            from torch.utils.data._utils import pin_memory as pm
        except ImportError:
            return
        redirect = self

        def pin_memory(data: Any, device: Any = None) -> Any:
            redirect.record("runtime-redirect-pin-memory")
            return data

        self._patch(pm, "pin_memory", pin_memory)

    def _install_amp(self) -> None:
        redirect = self
        base = torch.amp.autocast_mode.autocast

        class RedirectedAutocast(base):  # type: ignore[misc, valid-type]
            def __init__(self, device_type: str = "cuda", dtype: Optional[torch.dtype] = None,
                         enabled: bool = True, cache_enabled: Optional[bool] = None) -> None:
                if device_type == "cuda":
                    asked = str(dtype or torch.float16).replace("torch.", "")
                    device_type, dtype = redirect.device, redirect.autocast_dtype
                    if enabled:
                        redirect.record("runtime-redirect-autocast", dtype=str(dtype).replace("torch.", ""), asked=asked)
                super().__init__(device_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)

        class CudaAmpAutocast(RedirectedAutocast):
            def __init__(self, enabled: bool = True, dtype: torch.dtype = torch.float16,
                         cache_enabled: bool = True) -> None:
                super().__init__("cuda", dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)

        scaler_base = torch.amp.GradScaler

        class RedirectedGradScaler(scaler_base):  # type: ignore[misc, valid-type]
            def __init__(self, device: str = "cuda", *args: Any, enabled: bool = True, **kwargs: Any) -> None:
                if device == "cuda":
                    redirect.record("runtime-redirect-grad-scaler")
                    device, enabled = redirect.device, False
                super().__init__(device, *args, enabled=enabled, **kwargs)

        class CudaGradScaler(RedirectedGradScaler):
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__("cuda", *args, **kwargs)

        self._patch(torch, "autocast", RedirectedAutocast)
        self._patch(torch.amp, "autocast", RedirectedAutocast)
        self._patch(torch.amp, "GradScaler", RedirectedGradScaler)
        import torch.cuda.amp as cuda_amp
        self._patch(cuda_amp, "autocast", CudaAmpAutocast)
        self._patch(cuda_amp, "GradScaler", CudaGradScaler)

    def _install_distributed(self) -> None:
        import torch.distributed as dist
        if not dist.is_available():
            return
        from torch.distributed import distributed_c10d as c10d
        real_init = c10d.init_process_group
        redirect = self

        def init_process_group(backend: Any = None, *args: Any, **kwargs: Any) -> Any:
            kw_backend = kwargs.pop("backend", None)
            backend = backend if backend is not None else kw_backend
            if backend is not None and "nccl" in str(backend).lower():
                redirect.record("runtime-redirect-nccl", asked=str(backend))
                backend = "gloo"
            elif backend is None and redirect.device == "cpu":
                # torch's default pairs CUDA tensors with NCCL where the build has it (PyPI's CUDA build of torch
                # 2.4.1 on a machine without a GPU: "ProcessGroupNCCL is only supported with GPUs"); every tensor is
                # on the CPU here
                backend = "gloo"
            return real_init(backend, *args, **kwargs)

        self._patch(dist, "init_process_group", init_process_group)
        self._patch(c10d, "init_process_group", init_process_group)
        try:  # init_device_mesh starts the default group itself, through the name its module bound at import
            import torch.distributed.device_mesh as mesh_module
        except ImportError:  # pragma: no cover - torch without distributed
            mesh_module = None
        if getattr(mesh_module, "init_process_group", None) is real_init:
            self._patch(mesh_module, "init_process_group", init_process_group)
        self._install_device_mesh()
        if self.device == "cpu":
            from torch.nn.parallel import distributed as ddp_mod
            real_ddp_init = ddp_mod.DistributedDataParallel.__init__

            def ddp_init(module_self: Any, module: Any, device_ids: Any = None, output_device: Any = None,
                         *args: Any, **kwargs: Any) -> None:
                if device_ids is not None or output_device is not None:
                    redirect.record("runtime-redirect-ddp-device-ids", asked=device_ids)
                real_ddp_init(module_self, module, None, None, *args, **kwargs)

            self._patch(ddp_mod.DistributedDataParallel, "__init__", ddp_init)

    def _install_device_mesh(self) -> None:
        """A ``DeviceMesh`` (``init_device_mesh("cuda", ...)`` makes one) of CUDA type becomes a mesh of the run device:
        its DTensors' local tensors are there already (their moves are redirected), and FSDP over a CUDA mesh refused
        a DTensor parameter that was not on ``cuda:0`` (pytorch/examples tensor_parallelism fsdp_tp_example: "Expects
        DTensor to be moved to cuda but got cpu")."""
        try:
            from torch.distributed.device_mesh import DeviceMesh
        except ImportError:  # pragma: no cover - torch without distributed
            return
        real = DeviceMesh.__init__
        redirect = self

        def mesh_init(device_mesh: Any, /, *args: Any, **kwargs: Any) -> None:  # DeviceMesh takes mesh= itself
            if args and _is_cuda(args[0]):
                redirect.record("runtime-redirect-device-mesh", asked=args[0])
                args = (redirect.device, *args[1:])
            elif _is_cuda(kwargs.get("device_type")):
                redirect.record("runtime-redirect-device-mesh", asked=kwargs["device_type"])
                kwargs = dict(kwargs, device_type=redirect.device)
            real(device_mesh, *args, **kwargs)
        mesh_init.__wrapped__ = real  # type: ignore[attr-defined]
        self._patch(DeviceMesh, "__init__", mesh_init)

    def _install_attention(self) -> None:
        """On the CPU, ``F.scaled_dot_product_attention`` of DTensors split by heads (tensor parallelism: the query,
        key and value all sharded on the batch or the head dimension, or replicated, alike, no mask) runs on each
        rank's local tensors, as DTensor's strategies for CUDA's flash, efficient and cuDNN kernels do: DTensor has none
        for the CPU flash-attention kernel SDPA picks there, and pytorch/examples tensor_parallelism fsdp_tp_example
        ended at it ("Operator aten._scaled_dot_product_flash_attention_for_cpu.default does not have a sharding
        strategy registered"; SDPA's math form adds a plain causal mask to the DTensor scores). Any other call is
        SDPA's own."""
        if self.device != "cpu":
            return
        import functools

        import torch.nn.functional as F
        real = F.scaled_dot_product_attention

        @functools.wraps(real)
        def scaled_dot_product_attention(query: Any, key: Any, value: Any, *args: Any, **kwargs: Any) -> Any:
            out = headwise_attention(real, query, key, value, args, kwargs)
            return real(query, key, value, *args, **kwargs) if out is None else out

        self._patch(F, "scaled_dot_product_attention", scaled_dot_product_attention)

    def rebind(self, fn: Any) -> None:
        """In a process that imported the program before :meth:`install` (a ``mp.spawn`` worker unpickles the
        program's function first): the names it bound to the originals, bound to the redirect's versions
        (:func:`hal.conformance.runtime.rebinding.rebind`)."""
        from hal.conformance.runtime.rebinding import rebind
        rebind(fn, self._saved)

    def enable_grad_scalers(self, asked_for: tuple) -> None:
        """After :meth:`install`: a GradScaler the program enables for a device in ``asked_for`` runs
        enabled on this run's device instead of disabled (the precision runs need the program's loss
        scaling on both sides of a comparison). Restored by :meth:`remove`."""
        from hal.conformance.runtime.capture import enable_program_grad_scalers
        enable_program_grad_scalers(self._patch, self.device, asked_for)

    def remove(self) -> None:
        try:
            self.__exit__(None, None, None)
        finally:
            for owner, name, value in reversed(self._saved):
                setattr(owner, name, value)
            self._saved = []


_TENSOR_CUDA = torch.Tensor.cuda
_TENSOR_TO = torch.Tensor.to
_TENSOR_PIN = torch.Tensor.pin_memory
_PARSE_TO = getattr(getattr(torch._C, "_nn", None), "_parse_to", None)
