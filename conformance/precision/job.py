"""A planned float64 shadow: :class:`ShadowJob` (made by :meth:`shadow.Shadow.plan`, computed by
:meth:`shadow.Shadow.flush`)."""
from __future__ import annotations

import dataclasses
from typing import Any, List, Optional

import torch


@dataclasses.dataclass(eq=False)
class ShadowJob:
    """One op's float64 shadow, planned while the step runs (:meth:`Shadow.plan`: nothing computed, the
    inputs are the program's tensors or views of them) and computed later (:meth:`Shadow.flush`), batched
    with the jobs of the same op, argument shapes and constants: all layers' copies of an op become one
    float64 call. Whoever holds a job keeps ``inputs`` and ``target`` unchanged until it is flushed (the
    tracer copies one when the program is about to write it); after the flush ``ref`` (or ``error``) is
    set and ``inputs`` is emptied."""

    fn: Any  #: called on the float64 arguments (an aten overload, or F.scaled_dot_product_attention)
    args: tuple  #: argument template: each input tensor replaced by its slot (:class:`shadow._Slot`)
    kwargs: dict
    inputs: List[torch.Tensor]  #: in slot order; floating ones are made float64, the rest moved as they are
    home: torch.device  #: where the float64 call runs (:func:`shadow.float64_home`)
    out_index: int  #: which output of ``fn`` is compared (when it returns several)
    target: torch.Tensor  #: the target values compared with ``ref``
    how: str  #: the sampling, for the report
    key: Optional[tuple]  #: jobs of one key run as one batched call; None: on its own
    ref: Optional[torch.Tensor] = None
    #: True for a job planned for another output of the same op call as the job planned just before it: the two
    #: share ``inputs`` (one list), and run one by one they share one float64 call (:meth:`Shadow.flush`)
    shared: bool = False
    error: Optional[str] = None
    #: when not 0, ``fn`` returns after its compared outputs the magnitude each one's rounding error scales with, this
    #: many places later (:func:`attention.math_attention_grads`); after the flush ``magnitude`` holds the compared
    #: output's (cut like ``ref``): the local comparison's element scale is at least it
    magnitude_offset: int = 0
    magnitude: Optional[torch.Tensor] = None
