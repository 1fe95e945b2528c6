"""Hardening: every bad input and injected fault of the battery gets its documented exit code, one
clear line or a written report, and leaves no process behind (benchmarks/hardening_battery.py)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("hardening_battery", ROOT / "benchmarks" / "hardening_battery.py")
battery = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(battery)


@pytest.fixture(scope="module")
def tmp(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("battery")
    battery.make_inputs(folder)
    return folder


CASES = battery.cases(Path("unused"), create=False)  # names only; each test builds its inputs


@pytest.mark.parametrize("name", [c["name"] for c in CASES])
def test_battery_case_survives(name, tmp):
    case = {c["name"]: c for c in battery.cases(tmp, create=False)}[name]
    res = battery.run_case(case, tmp)
    assert res["survived"], res["problems"]
