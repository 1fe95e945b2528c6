"""Stop an audited program after N optimizer steps or forward passes, without its cooperation.

:class:`StepLimiter` installs global hooks: ``torch.optim`` step pre/post hooks (every optimizer,
including those GradScaler drives) and, through :class:`~.capture.ModuleTracker`, a callback before
each top-level module forward. It raises :class:`StopAudit` (a ``BaseException``, so the program's
own ``except Exception`` clauses do not swallow it) once the limit is reached:

- after the N-th optimizer step (training programs);
- for programs that have not stepped an optimizer, before the (N+1)-th top-level forward pass of
  a module with parameters run with grad disabled (inference programs: ``no_grad`` /
  ``inference_mode``). Forward passes with grad enabled are not counted, so a training step's
  forward, loss module and backward never stop it early.

The runner treats :class:`StopAudit` as success. Not thread-safe (one limiter per process).
"""
from __future__ import annotations

from typing import Any, Optional

import torch


class StopAudit(BaseException):
    """Raised by the step hooks once the audit has seen enough; caught by the runner."""


class StepLimiter:
    def __init__(self, limit: Optional[int], capture: Any = None) -> None:
        self.limit = limit
        self.capture = capture
        self.optimizer_steps = 0
        self.inference_forwards = 0
        self._handles: list = []

    @property
    def steps(self) -> int:
        """Steps completed: optimizer steps if any were taken, else counted inference forwards."""
        return self.optimizer_steps or self.inference_forwards

    def _pre_step(self, _opt: Any, _args: Any, _kwargs: Any) -> None:
        if self.capture is not None:
            self.capture.optimizer_depth += 1

    def _post_step(self, _opt: Any, _args: Any, _kwargs: Any) -> None:
        if self.capture is not None and self.capture.optimizer_depth:
            self.capture.optimizer_depth -= 1
        self.optimizer_steps += 1
        if self.limit is not None and self.optimizer_steps >= self.limit:
            raise StopAudit(f"{self.optimizer_steps} optimizer steps")

    def before_top_level_forward(self, module: torch.nn.Module) -> None:
        if self.optimizer_steps or torch.is_grad_enabled():
            return
        if next(iter(module.parameters(recurse=True)), None) is None:
            return
        if self.limit is not None and self.inference_forwards >= self.limit:
            raise StopAudit(f"{self.inference_forwards} forward passes")
        self.inference_forwards += 1

    def install(self) -> None:
        from torch.optim import optimizer as o
        self._handles = [o.register_optimizer_step_pre_hook(self._pre_step),
                         o.register_optimizer_step_post_hook(self._post_step)]

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
