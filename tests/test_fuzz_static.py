"""The static analyser never crashes on generated and mutated sources, and its patches still parse
(benchmarks/fuzz_static.py runs the same properties on many more inputs)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("fuzz_static", ROOT / "benchmarks" / "fuzz_static.py")
fuzz_static = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fuzz_static)


def test_fuzzed_sources_never_crash_the_scan_or_break_the_patch():
    res = fuzz_static.fuzz(400, seed=7)
    assert res["seeds"] >= 20 and res["parsed"] > 100 and res["rejected_by_parser"] > 50
    assert res["failures"] == [], res["failures"][:3]


def test_a_broken_patch_would_be_caught():
    """The property is not vacuous: a patch that breaks syntax is reported."""
    from hal.conformance.migration import load_rules
    from hal.conformance.migration import patch as patch_mod
    real = patch_mod.patched_source
    try:
        fuzz_static_patch = lambda *a, **k: real(*a, **k) + "\n)\n"  # noqa: E731
        import hal.conformance.migration.patch as p
        p.patched_source = fuzz_static_patch
        why = fuzz_static.check("import torch\nx = torch.ones(1).cuda()\n", {"mlu": load_rules("mlu")})
        assert why and "does not parse" in why
    finally:
        patch_mod.patched_source = real
