"""Precision comparison against a float64 CPU reference, with first-divergence localisation.

Public API (used by ``hal-audit --precision`` and ``python -m hal.conformance.precision``):
:func:`compare_workload`, :func:`compare_module`, :class:`PrecisionResult`,
:func:`check_checkpoint_portability`. See docs/precision.md for the rules.
"""
from .checkpoint import check_checkpoint_portability
from .compare import compare_module, compare_workload, default_loss, to_reference
from .result import PrecisionResult

__all__ = ["compare_module", "compare_workload", "PrecisionResult", "check_checkpoint_portability",
           "default_loss", "to_reference"]
