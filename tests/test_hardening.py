"""Hardening: every bad input and injected fault of the battery gets its documented exit code, one
clear line or a written report, and leaves no process behind (benchmarks/hardening_battery.py)."""
from __future__ import annotations

import importlib.util
import json
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


# ---- escaping of everything the audited program controls (conformance/report/escape.py) -----------------
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from hal.conformance.report import escape  # noqa: E402

_HOSTILE = ["![px](https://evil.example/pixel.png)", "[x](javascript:alert(1))", "<img src=x onerror=alert(1)>",
            "<https://evil.example>", "# heading", "- item", "1. item", "| a | b |", "`code`", "**bold**",
            "&lt;script&gt;", "\x1b[2J\x1b[31mred", "line\nbreak\r\n", "\u202egnp.exe", "a\\](b)"]


@given(st.lists(st.sampled_from(_HOSTILE) | st.text(max_size=30), max_size=6).map("".join))
@settings(max_examples=300, deadline=None)
def test_markdown_escape_leaves_no_markup(text):
    import re
    out = escape.markdown(text)
    assert "<" not in out and ">" not in out and "\n" not in out and "\x1b" not in out
    assert not re.search(r"(?<!\\)[\[\]()!`*_#|]", out.replace("\\\\", ""))  # every markup character escaped
    assert escape.printable(text).replace(" ", "") in _unescape_md(out).replace(" ", "")  # nothing lost


def _unescape_md(s: str) -> str:
    import re
    s = re.sub(r"\\(.)", r"\1", s)
    return s.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")


def test_terminal_sarif_and_html_escapes():
    assert escape.terminal("a\x1b[31mb\x07\n") == "a\\x1b[31mb\\x07 "
    assert escape.sarif_text("see [x](1)") == "see \\[x\\](1)"
    assert escape.html_text("<img src=x>\x1b") == "&lt;img src=x&gt;\\x1b"


def test_report_writers_escape_program_text(tmp_path):
    from hal.conformance import report as rep
    bad = "![px](https://evil.example/p.png) \x1b[2J [c](javascript:x) <b>"
    report = rep.new_report({"device": "cpu", "source": bad, "kind": "script", "available": True,
                             "verified": True, "reason": bad},
                            run={"status": "error", "steps": None, "seconds": 1.0, "error": bad,
                                 "output_tail": [bad]},
                            findings=[{"rule": "cuda-call", "severity": "error", "path": bad, "line": 1, "column": 1,
                                       "message": bad}], ops=[])
    written = rep.write_reports(report, tmp_path, {})
    md = written["md"].read_text()
    import re
    assert not re.search(r"(?<!\\)\]\(", md) and "<b>" not in md and "\x1b" not in md
    sarif = json.loads(written["sarif"].read_text())
    assert sarif["runs"][0]["results"][0]["message"]["text"].startswith("!\\[px\\](https")
    text = rep.render(report, "text", written=written)
    assert "\x1b" not in text and "\\x1b[2J" in text


# ---- the exit-code contract's remaining codes (4 internal error, 130 interrupted), on the shared plumbing ----
@pytest.mark.parametrize("exc,code,line", [
    (RuntimeError("boom\nsecond line"), 4, "prog: internal error: RuntimeError: boom second line (set HAL_DEBUG=1"),
    (KeyboardInterrupt(), 130, "prog: interrupted"),
])
def test_run_cli_maps_unexpected_failures(capsys, monkeypatch, exc, code, line):
    from hal.commandline import run_cli
    monkeypatch.delenv("HAL_DEBUG", raising=False)

    def handler(_args):
        raise exc
    assert run_cli(lambda: object(), handler, prog="prog") == code
    err = capsys.readouterr().err
    assert err.startswith(line) and len(err.strip().splitlines()) == 1


def test_usage_error_is_one_line_not_a_usage_block(capsys):
    from hal.cli import main as hal_main
    assert hal_main.main(["matrix", "--steps", "three"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.splitlines() == [
        "hal: error: argument --steps: invalid int value: 'three' (see hal matrix --help)"]


@pytest.mark.parametrize("kwargs,match", [({"steps": 0}, "steps must be a positive integer"),
                                          ({"timeout_s": -1.0}, "timeout_s must be"),
                                          ({"timeout_s": float("nan")}, "timeout_s must be")])
def test_matrix_library_refuses_bad_numbers_before_running(kwargs, match):
    from hal.conformance.matrix.runner import run_matrix
    with pytest.raises(ValueError, match=match):
        run_matrix(["cpu"], ["gpt"], ["train"], ["float32"], **kwargs)


@pytest.mark.parametrize("timeout,dtypes,match", [(-5.0, ("float32",), "timeout_s must be"),
                                                  (float("nan"), ("float32",), "timeout_s must be"),
                                                  (5.0, (), "dtypes must name")])
def test_collectives_library_refuses_bad_input(timeout, dtypes, match):
    from hal.testing import collectives
    with pytest.raises(ValueError, match=match):
        collectives.run("cpu", 2, timeout, dtypes)
