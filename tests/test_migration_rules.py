"""Static migration rules: exact flagged lines on realistic CUDA scripts, and nothing on look-alikes.

The fixtures in examples/migration/ carry ``# expect: rule`` comments on every line the MLU audit
must report; every other line must stay silent (docstrings, comments, look-alike names and strings).
"""
import collections
import io
import pathlib
import tokenize

import pytest
import yaml

from hal.conformance.migration import CATALOGUE, AuditInputError, RulesError, audit_static, load_rules
from hal.conformance.migration.scanner import scan_source

ROOT = pathlib.Path(__file__).resolve().parents[1]
FIXTURES = sorted((ROOT / "examples" / "migration").glob("*.py"))
SHARED_ENV = ROOT.parent / "shared" / "data" / "mlu" / "env_map.tsv"


def expected(path: pathlib.Path) -> collections.Counter:
    out = collections.Counter()
    for tok in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
        if tok.type == tokenize.COMMENT and tok.string.startswith("# expect:"):
            for rule in tok.string.split(":", 1)[1].split(","):
                out[(tok.start[0], rule.strip())] += 1
    return out


def test_fixtures_exist_and_cover_the_issue_list():
    names = {p.name for p in FIXTURES}
    assert {"ddp_nccl.py", "amp_scaler.py", "custom_ext.py", "env_capability.py", "float64_math.py",
            "lookalikes.py"} <= names
    rules = set()
    for p in FIXTURES:
        rules |= {r for _, r in expected(p)}
    # every rule kind that applies to source lines is exercised by some fixture
    assert rules >= set(CATALOGUE) - {"parse-error", "unreadable", "cuda-api-unsupported"}


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.name)
def test_exact_findings_on_fixture(path):
    got = collections.Counter((f.line, f.rule) for f in audit_static(path, "mlu").findings)
    want = expected(path)
    assert got == want, f"missing {sorted((want - got).elements())}, unexpected {sorted((got - want).elements())}"


def test_lookalikes_produce_nothing():
    res = audit_static(ROOT / "examples" / "migration" / "lookalikes.py", "mlu")
    assert res.findings == []
    assert res.patch("device") == "" and res.patch("hal") == ""


def test_finding_fields_name_the_counterpart():
    res = audit_static(ROOT / "examples" / "migration" / "ddp_nccl.py", "mlu")
    by_line = {(f.line, f.rule): f for f in res.findings}
    f = by_line[(18, "cuda-api")]
    assert f.path == "ddp_nccl.py" and f.column == 5 and f.severity == "error"
    assert "torch.mlu.set_device" in f.message and f.counterpart == "torch.mlu.set_device"
    d = f.as_dict("device")
    assert d["fix"] == "torch.mlu.set_device" and d["fixes"]["hal"] == "hal_portable.set_device"
    nccl = by_line[(19, "nccl-backend")]
    assert "'cncl'" in nccl.message and nccl.fix_text("device") == '"cncl"'
    assert by_line[(41, "reduce-op")].fix_text("device") is None


def scan(src, device="mlu"):
    return [(f.line, f.rule) for f in scan_source(src, "x.py", load_rules(device)).findings]


def test_alias_forms_resolve():
    src = ("import torch.cuda as tc\nfrom torch import cuda\nfrom torch.cuda.amp import autocast as ac\n"
           "import torch as th\nimport os as o\n"
           "tc.synchronize()\ncuda.current_device()\nwith ac():\n    pass\nth.cuda.Event()\n"
           "o.environ['CUDA_VISIBLE_DEVICES'] = '1'\n")
    assert scan(src) == [(6, "cuda-api"), (7, "cuda-api"), (8, "cuda-amp"), (10, "cuda-api"), (11, "env-var")]


def test_shadowed_names_are_not_torch():
    # `cuda` here is the user's own object, not torch.cuda; `os` is not imported
    src = "class cuda:\n    pass\ncuda.synchronize()\nos.environ['CUDA_VISIBLE_DEVICES'] = '1'\n"
    assert scan(src) == []


def test_unsupported_api_and_cpu_target():
    assert scan("import torch\ntorch.cuda.utilization()\n") == [(2, "cuda-api-unsupported")]
    src = "import torch\nx = torch.ones(1).double()\ntorch.cuda.synchronize()\n"
    assert scan(src, "cpu") == [(3, "cuda-api")]  # float64 is native on the CPU
    assert scan(src, "cuda") == []  # CUDA code is native on CUDA


def test_rules_are_per_backend_data():
    for name in ("mlu", "cpu", "cuda"):
        rs = load_rules(name)
        assert rs.backend == name and set(rs.rules) == set(CATALOGUE), name
        assert pathlib.Path(rs.source).name == "migration_rules.yaml"
        assert pathlib.Path(rs.source).parent.name == name
    mlu = load_rules("mlu")
    assert mlu.map_api("torch.cuda.CUDAGraph") == (True, "torch.mlu.MLUGraph")
    assert mlu.map_api("torch.cuda.amp.GradScaler") == (True, "torch.mlu.amp.GradScaler")
    assert mlu.map_api("torch.nn.Linear") == (False, None)
    assert mlu.provenance["commit"] == "9e95f972d3bfda0a855f9500aec852664ceecb6a"


@pytest.mark.skipif(not SHARED_ENV.exists(), reason="../shared/data/mlu/env_map.tsv not present")
def test_mlu_env_map_matches_shared_tsv():
    rows = [ln.rstrip("\n").split("\t") for ln in SHARED_ENV.read_text().splitlines(True)
            if ln.strip() and not ln.startswith("#")]
    tsv = {r[0]: (r[1] if len(r) > 1 and r[1] else None) for r in rows}
    assert load_rules("mlu").env == tsv
    header = SHARED_ENV.read_text().splitlines()[1]
    assert load_rules("mlu").provenance["commit"] in header


def test_unknown_device_and_bad_rules(tmp_path):
    with pytest.raises(RulesError, match="unknown device 'tpu'.*cpu"):
        load_rules("tpu")
    bad = tmp_path / "r.yaml"
    bad.write_text(yaml.safe_dump({"schema": "hal-migration-rules/1", "device_type": "x",
                                   "rules": {"no-such-rule": {"severity": "error"}}}))
    with pytest.raises(RulesError, match=r"r\.yaml: .*\$\.rules\['no-such-rule'\]: unknown rule id 'no-such-rule'$") as exc:
        load_rules("x", str(bad))
    assert exc.value.path == ("rules", "no-such-rule")


def test_bad_inputs(tmp_path):
    with pytest.raises(AuditInputError, match="no such file"):
        audit_static(tmp_path / "missing.py", "mlu")
    (tmp_path / "a.txt").write_text("x = 1\n")
    with pytest.raises(AuditInputError, match="not a Python file"):
        audit_static(tmp_path / "a.txt", "mlu")
    (tmp_path / "s.py").write_text("x = 1\ny = (\n")
    with pytest.raises(AuditInputError, match=r"s.py:2: syntax error"):
        audit_static(tmp_path / "s.py", "mlu")
    (tmp_path / "b.py").write_bytes(b"\x7fELF\x00\x00\x01")
    with pytest.raises(AuditInputError, match="binary"):
        audit_static(tmp_path / "b.py", "mlu")


def test_folder_walk_skips_envs_and_reports_broken_files(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "train.py").write_text("import torch\ntorch.cuda.synchronize()\n")
    (tmp_path / "pkg" / "broken.py").write_text("def f(:\n")
    (tmp_path / "pkg" / "kernel.cu").write_text("__global__ void k() {}\n")
    for skipped in (".git", "build", "venv_custom", "node_modules"):
        (tmp_path / skipped).mkdir()
        (tmp_path / skipped / "x.py").write_text("import torch\ntorch.cuda.synchronize()\n")
    (tmp_path / "venv_custom" / "pyvenv.cfg").write_text("home = /usr\n")
    res = audit_static(tmp_path, "mlu")
    got = sorted((f.path, f.line, f.rule) for f in res.findings)
    assert got == [("pkg/broken.py", 1, "parse-error"), ("pkg/kernel.cu", 1, "cuda-source"),
                   ("pkg/train.py", 2, "cuda-api")]
    assert res.files == 1 and res.lines == 2


def test_non_ascii_columns():
    src = "import torch\nnom = 'é'; x = torch.ones(1, device='cuda')\n"
    (f,) = scan_source(src, "x.py", load_rules("mlu")).findings
    assert (f.line, f.column) == (2, src.splitlines()[1].index("'cuda'") + 1)


# ---- properties -----------------------------------------------------------------------------------
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_FRAG = st.sampled_from(["cuda", "nccl", "CUDA", "gpu", "x", "use", "is", "num", "graph", "_", "2"])
_IDENT = st.lists(_FRAG, min_size=1, max_size=4).map("_".join).map(lambda s: "v_" + s).filter(str.isidentifier)
_TEXT = st.lists(st.sampled_from(["cuda", "cuda:0", "nccl", "torch.cuda.synchronize()", ".cuda()", "CUDA_VISIBLE_DEVICES",
                                  "float64", " ", "x"]), max_size=5).map("".join)


@st.composite
def lookalike_program(draw):
    lines = ["import torch", "import os", f'"""{draw(_TEXT)}"""']
    for _ in range(draw(st.integers(1, 8))):
        name, other, text = draw(_IDENT), draw(_IDENT), draw(_TEXT)
        lines.append(draw(st.sampled_from([
            f"{name} = {text!r}  # {text}",
            f"def {name}({other}):\n    return {other}.{name}",
            f"print({text!r}, {name!r})",
            f"{name} = {{{text!r}: {other!r}}}",
            f"# torch.cuda.{name}() {text}",
            f"class {name}:\n    {other} = {text!r}",
            f"{name} = os.environ.get('HOME', {text!r})",
        ])))
    return "\n".join(lines) + "\n"


@settings(max_examples=60, deadline=None)
@given(lookalike_program())
def test_property_lookalikes_never_flagged(src):
    sc = scan_source(src, "p.py", load_rules("mlu"))
    assert sc.findings == [], src


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["torch.device({s})", "x.to({s})", "torch.ones(1, device={s})",
                                           "torch.autocast(device_type={s})"]),
                          st.one_of(st.just("cuda"), st.integers(0, 15).map(lambda n: f"cuda:{n}")),
                          st.sampled_from(["'", '"'])), min_size=1, max_size=6))
def test_property_device_strings_fixed_exactly(stmts):
    from hal.conformance.migration.patch import patched_source
    src = "import torch\nx = torch.ones(1)\n" + "".join(t.format(s=f"{q}{d}{q}") + "\n" for t, d, q in stmts)
    rules = load_rules("mlu")
    sc = scan_source(src, "p.py", rules)
    assert [f.rule for f in sc.findings] == ["device-string"] * len(stmts)
    for flavour in ("device", "hal"):
        out = patched_source(sc, src, flavour, rules.import_module)
        assert scan_source(out, "p.py", rules).findings == []
        compile(out, "p.py", "exec")
    out = patched_source(sc, src, "device", rules.import_module)
    assert [ln for ln in out.splitlines()[3:]] == [
        t.format(s=f"{q}{d.replace('cuda', 'mlu')}{q}") for t, d, q in stmts]
