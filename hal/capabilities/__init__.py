"""Capability manifests as data, and the query API the audits use.

``op_status(backend, op, dtypes, arch)`` says whether an ATen overload runs natively on a backend,
through a composite PyTorch implements for every backend, falls back to the CPU, or cannot run,
with the reason and the ops the verdict rests on. See docs/capabilities.md.
"""
from hal.capabilities.manifest import Manifest, load_manifest
from hal.capabilities.names import normalize_op
from hal.capabilities.query import OpStatus, op_status, parse_arch, target_equivalent, target_torch

__all__ = ["Manifest", "OpStatus", "load_manifest", "normalize_op", "op_status", "parse_arch", "target_equivalent", "target_torch"]
