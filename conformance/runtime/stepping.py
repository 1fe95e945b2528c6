"""Stop an audited program after N steps, without its cooperation, and say which bound stopped it.

:class:`StepLimiter` installs global hooks: ``torch.optim`` step pre/post hooks (every optimizer,
including those GradScaler drives), a wrapper around ``torch.autograd.backward`` (what
``Tensor.backward`` calls) and, through :class:`~.capture.ModuleTracker`, a callback before each
top-level module forward. It raises :class:`StopAudit` (a ``BaseException``, so the program's own
``except Exception`` clauses do not swallow it) once a bound is reached; ``stopped_by`` names it:

- ``"optimizer steps"``: after the N-th optimizer step (training programs);
- ``"backward passes"``: after the N-th backward pass of a program that has built no optimizer
  (hand-written SGD such as pytorch/examples word_language_model);
- ``"forward passes"``: before the (N+1)-th top-level forward pass of a module with parameters
  run with grad disabled (``no_grad`` / ``inference_mode``) since the last backward or optimizer
  step: an inference program, or an evaluation loop between training steps (or before them, in a
  program that has built no optimizer). A program that has built an optimizer and not trained yet
  is not stopped by its first evaluation (nanoGPT evaluates at iteration 0): the training bound
  follows. Forward passes with grad enabled are not counted, so a training step's forward, loss
  module and backward never stop it early. With ``eval_seconds`` (the precision and profile runs,
  which need the training steps that come after such a loop), a loop that follows a training step is
  bounded by time instead: it is stopped at its first top-level forward more than ``eval_seconds``
  after its first (minGPT's chargpt samples 500 tokens, one forward each, after its first step, and
  has no argument that skips it).

``limit`` None means no bound. The runner treats :class:`StopAudit` as success. Not thread-safe
(one limiter per process).
"""
from __future__ import annotations

import time
from typing import Any, Optional

import torch


class StopAudit(BaseException):
    """Raised by the step hooks once the audit has seen enough; caught by the runner."""


class StepLimiter:
    def __init__(self, limit: Optional[int], capture: Any = None, eval_seconds: Optional[float] = None) -> None:
        self.limit = limit
        self.eval_seconds = eval_seconds
        self._eval_began = 0.0  # time.monotonic() of the current no-grad loop's first forward
        self.capture = capture
        self.optimizer_steps = 0
        self.inference_forwards = 0
        self.backward_passes = 0
        self.eval_forwards = 0  # no-grad forwards since the last backward / optimizer step
        self.optimizers_built = 0
        self.stopped_by: Optional[str] = None
        self.counting = True  # False after remove(): the tracker's top-level forwards neither count nor stop
        self._handles: list = []
        self._saved: list = []

    @property
    def steps(self) -> int:
        """Steps completed: optimizer steps if any were taken, else backward passes, else counted
        inference forwards."""
        return self.optimizer_steps or self.backward_passes or self.inference_forwards

    def _stop(self, bound: str, n: int) -> None:
        self.stopped_by = bound
        raise StopAudit(f"{n} {bound}")

    def _pre_step(self, _opt: Any, _args: Any, _kwargs: Any) -> None:
        if self.capture is not None:
            self.capture.optimizer_depth += 1

    def _post_step(self, _opt: Any, _args: Any, _kwargs: Any) -> None:
        if self.capture is not None and self.capture.optimizer_depth:
            self.capture.optimizer_depth -= 1
        self.optimizer_steps += 1
        self.eval_forwards = 0
        if self.limit is not None and self.optimizer_steps >= self.limit:
            self._stop("optimizer steps", self.optimizer_steps)

    def after_backward(self) -> None:
        self.backward_passes += 1
        self.eval_forwards = 0
        if (self.limit is not None and not self.optimizers_built and not self.optimizer_steps
                and self.backward_passes >= self.limit):
            self._stop("backward passes", self.backward_passes)

    def before_top_level_forward(self, module: torch.nn.Module) -> None:
        if not self.counting or torch.is_grad_enabled():
            return
        if next(iter(module.parameters(recurse=True)), None) is None:
            return
        trained = self.optimizer_steps or self.backward_passes
        before_training = self.optimizers_built and not trained
        if not self.eval_forwards:
            self._eval_began = time.monotonic()
        if self.limit is not None and not before_training:
            if trained and self.eval_seconds is not None:
                if time.monotonic() - self._eval_began > self.eval_seconds:
                    self._stop("forward passes", self.eval_forwards)
            elif self.eval_forwards >= self.limit:
                self._stop("forward passes", self.eval_forwards)
        self.eval_forwards += 1
        if not self.optimizer_steps and not self.backward_passes:
            self.inference_forwards += 1

    def install(self) -> None:
        from torch.optim import optimizer as o
        self._handles = [o.register_optimizer_step_pre_hook(self._pre_step),
                         o.register_optimizer_step_post_hook(self._post_step)]
        limiter = self
        real_backward = torch.autograd.backward

        def backward(*args: Any, **kwargs: Any) -> Any:
            out = real_backward(*args, **kwargs)
            limiter.after_backward()
            return out

        real_init = o.Optimizer.__init__

        def optimizer_init(opt: Any, *args: Any, **kwargs: Any) -> None:
            limiter.optimizers_built += 1
            real_init(opt, *args, **kwargs)

        for owner, name, value in ((torch.autograd, "backward", backward), (o.Optimizer, "__init__", optimizer_init)):
            self._saved.append((owner, name, getattr(owner, name)))
            setattr(owner, name, value)

    def remove(self) -> None:
        """Stop counting and stopping: the hooks and patches taken back, and the module tracker's calls of
        :meth:`before_top_level_forward` ignored (what runs after the program, its exit handlers, is not a step)."""
        self.counting = False
        for h in self._handles:
            h.remove()
        self._handles = []
        for owner, name, value in reversed(self._saved):
            setattr(owner, name, value)
        self._saved = []
