"""Known answers of the capability query (hal.capabilities) for the MLU manifest and the CPU.

Expected MLU statuses were derived from ../shared/data/mlu/torch_mlu_kernels.tsv (torch_mlu
r2.4_develop @9e95f97) and this torch's dispatcher; a few are hand-checked in the comments. They are
*predictions* from a manifest: nothing here ran on an MLU.
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from hal.capabilities import OpStatus, load_manifest, normalize_op, op_status
from hal.capabilities.optable import load as load_optable

KERNELS = "../shared/data/mlu/torch_mlu_kernels.tsv"

# (op, expected status on MLU for float32)
MLU_TABLE = [
    # matmul family: mm/addmm/bmm are in mlu_functions.yaml; matmul/linear are CompositeImplicitAutograd
    ("aten::mm", "native"), ("aten::addmm", "native"), ("aten::bmm", "native"),
    ("aten::matmul", "native"),  # CIA in PyTorch, but torch_mlu registers its own matmul kernel
    ("aten::linear", "composite"),  # -> t/addmm/matmul
    ("aten::baddbmm", "native"), ("aten::addmv", "native"),
    # norms
    ("aten::native_layer_norm", "native"), ("aten::layer_norm", "composite"),
    ("aten::native_batch_norm", "native"), ("aten::group_norm", "native"), ("aten::instance_norm", "composite"),
    # softmax family
    ("aten::_softmax", "native"), ("aten::softmax.int", "native"),  # torch_mlu registers softmax.int itself
    ("aten::_log_softmax", "native"), ("aten::log_softmax.int", "native"),
    # attention: CIA in PyTorch; torch_mlu registers scaled_dot_product_attention itself
    ("aten::scaled_dot_product_attention", "native"),
    ("aten::_scaled_dot_product_flash_attention", "native"),
    # embedding
    ("aten::embedding", "native"), ("aten::embedding_dense_backward", "native"),
    # losses
    ("aten::cross_entropy_loss", "composite"),  # -> log_softmax.int, nll_loss_nd -> nll_loss_forward
    ("aten::nll_loss_forward", "native"), ("aten::nll_loss", "composite"),
    ("aten::mse_loss", "native"), ("aten::binary_cross_entropy_with_logits", "native"),
    ("aten::ctc_loss.IntList", "native"),  # torch_mlu lists ctc_loss.IntList itself
    # optimizer foreach ops (AdamW foreach=True)
    ("aten::_foreach_add_.List", "native"), ("aten::_foreach_mul_.Scalar", "native"),
    ("aten::_foreach_lerp_.Scalar", "native"), ("aten::_foreach_addcdiv_.ScalarList", "native"),
    ("aten::_fused_adamw_", "native"),
    # indexing
    ("aten::index_select", "native"), ("aten::gather", "native"), ("aten::scatter.src", "native"),
    ("aten::index.Tensor", "native"), ("aten::index_put_", "composite"),
    # sorting
    ("aten::sort.stable", "native"), ("aten::sort", "composite"),  # CEA sort -> sort.stable
    ("aten::topk", "native"), ("aten::median", "native"),
    ("aten::mode", "fallback"),  # no MLU kernel, CPU kernel only
    ("aten::nanmedian.dim", "fallback"),  # CEA -> nanmedian.dim_values, not in the MLU list
    ("aten::nanmedian", "fallback"),
    # linear algebra
    ("aten::_linalg_svd", "native"), ("aten::linalg_svd", "composite"),
    ("aten::linalg_eigh", "fallback"),  # CIA -> _linalg_eigh, not in the list
    ("aten::linalg_inv_ex", "native"), ("aten::linalg_qr", "native"),
    ("aten::linalg_solve", "fallback"), ("aten::cholesky", "fallback"),
    ("aten::linalg_vector_norm", "native"),
    # special functions
    ("aten::special_bessel_j0", "fallback"),  # CEANF -> special_bessel_j0.out: no MLU kernel
    ("aten::i0", "fallback"), ("aten::renorm", "fallback"), ("aten::erfinv", "native"),
    # reductions / joins that PyTorch composes for every backend
    ("aten::sum", "composite"),  # CEA sum -> sum.dim_IntList (+ views): MLU kernels
    ("aten::sum.dim_IntList", "native"), ("aten::stack", "composite"),  # -> cat
    ("aten::cat", "native"), ("aten::mean", "composite"), ("aten::mean.dim", "native"),
    ("aten::add.Tensor", "native"), ("aten::gelu", "native"), ("aten::silu", "native"),
    # MLU-only custom op: no CPU fallback exists
    ("torch_mlu::warp_ctc_loss", "unsupported"),
    ("custom::warp_ctc_loss", "native"),
    # not an op of this torch at all
    ("aten::definitely_not_an_op", "unknown"),
]


@pytest.mark.parametrize("op,expected", MLU_TABLE, ids=[o for o, _ in MLU_TABLE])
def test_mlu_op_status_table(op, expected):
    st = op_status("mlu", op, ("float32",))
    assert st.status == expected, st.reason
    assert st.reason and st.predicted is True
    assert st.via, "every verdict names the ops it rests on"


def test_table_is_large_and_covers_every_status():
    assert len(MLU_TABLE) >= 40
    assert {s for _, s in MLU_TABLE} == {"native", "composite", "fallback", "unsupported", "unknown"}


def test_nanmedian_reason_names_the_leaf():
    st = op_status("mlu", "aten::nanmedian.dim", dtypes=("float32",), arch=None)
    assert st.status == "fallback"
    assert st.via == ("aten::nanmedian.dim_values",)
    assert "no MLU kernel for aten::nanmedian.dim_values (called by the CompositeExplicitAutograd " \
           "aten::nanmedian.dim)" in st.reason
    assert "ENABLE_FALLBACK_TO_CPU=1 default" in st.reason


def test_composite_via_lists_native_leaves():
    st = op_status("mlu", "aten::stack", ("float32",))
    assert "aten::cat" in st.via and all(op_status("mlu", v).status == "native" for v in st.via)
    # the CIA sdpa picks its callee per backend (_fused_sdp_choice): checked with the CPU-key manifest
    st = op_status("cpu", "aten::scaled_dot_product_attention", ("float32",))
    assert st.status == "composite" and "aten::_scaled_dot_product_flash_attention_for_cpu" in st.via


def test_spellings_are_normalised():
    assert normalize_op("aten.addmm.default") == "aten::addmm"
    assert normalize_op("aten::addmm.default") == "aten::addmm"
    assert normalize_op("aten.add.Tensor") == "aten::add.Tensor"
    assert normalize_op("nanmedian.dim") == "aten::nanmedian.dim"
    a, b, c = (op_status("mlu", n) for n in ("aten.addmm.default", "aten::addmm.default", "aten::addmm"))
    assert a == b == c and a.op == "aten::addmm"
    with pytest.raises(ValueError):
        normalize_op("")


def test_dtype_downgrade_and_gates():
    st = op_status("mlu", "aten::mm", ("float64",))
    assert st.status == "native"
    assert st.dtype_notes == ("float64 is computed as float32 on MLU (silently)",)
    assert op_status("mlu", "aten::mm", ("complex128",)).dtype_notes == ("complex128 is computed as complex64 on MLU (silently)",)
    assert op_status("mlu", "aten::mm", ("bfloat16",), arch=(5, 0)).status == "native"
    old = op_status("mlu", "aten::mm", ("bfloat16",), arch=(3, 0))
    assert old.status == "unsupported" and "major >= 5" in old.reason
    assert "architecture not given" in op_status("mlu", "aten::mm", ("bfloat16",)).dtype_notes[0]
    assert op_status("mlu", "aten::mm", ("float8_e4m3fn",), arch=5).status == "unsupported"
    assert op_status("mlu", "aten::mm", ("float8_e4m3fn",), arch=6).status == "native"
    q = op_status("mlu", "aten::add.Tensor", ("qint8",))
    assert q.status == "unsupported" and "quantized" in q.reason


def test_fallback_policy_off_makes_fallback_unsupported():
    st = op_status("mlu", "aten::mode", ("float32",), fallback_to_cpu=False)
    assert st.status == "unsupported" and "ENABLE_FALLBACK_TO_CPU=0" in st.reason
    assert op_status("mlu", "aten::mm", fallback_to_cpu=False).status == "native"


def test_risk_hints_from_the_api_list():
    st = op_status("mlu", "aten::linalg_eigh")
    assert any("torch.linalg.eigh" in h for h in st.hints)


def test_as_dict_round_trips_to_json():
    d = op_status("mlu", "aten::nanmedian.dim", ("float64",)).as_dict()
    back = json.loads(json.dumps(d))
    assert back["via"] == list(d["via"]) and back["status"] == "fallback" and back["dtype_notes"]
    assert set(d) >= {"op", "backend", "status", "reason", "via", "dtype_notes", "predicted"}
    assert isinstance(op_status("mlu", "aten::mm"), OpStatus)


def test_mlu_manifest_provenance_and_contents():
    m = load_manifest("mlu")
    p = m.provenance
    assert p["commit"] == "9e95f972d3bfda0a855f9500aec852664ceecb6a" and p["torch_pairing"] == "2.4"
    assert p["generated_by"].startswith("python -m hal.capabilities.generate mlu")
    assert m.predicted and m.dispatch_key == "PrivateUse1"
    # 800 aten lines in the TSV; logical_or.out is listed twice
    assert len(m.data["native"]["aten"]) == 799 and len(m.data["native"]["custom"]) == 26
    assert m.tf32_defaults["conv"] is True and m.tf32_defaults["matmul"] is False
    assert set(m.collectives["unsupported_reduce_ops"]) == {"BAND", "BOR", "BXOR", "PREMUL_SUM"}
    assert m.fallback["env"] == "ENABLE_FALLBACK_TO_CPU" and m.fallback["default_enabled"] is True
    assert len(m.env_map) == 39 and sum(v is None for v in m.env_map.values()) == 16
    assert m.data["api_support"]["counts"] == {"rows": 4260, "true": 2073, "false": 2187, "limitation_notes": 136}
    # torch.Tensor.coalesce is listed under torch.Size (true) and torch.sparse (false): the riskier flag wins
    assert m.api_support("torch.Tensor.coalesce")["supported"] is False
    assert m.api_support("torch.nn.functional.rms_norm") == {"supported": False, "limitation_note": False}


def test_manifest_files_are_small():
    import pathlib
    import hal.backends.mlu
    mlu = pathlib.Path(hal.backends.mlu.__file__).parent / "manifest.json"
    from hal.capabilities.optable import DATA
    assert mlu.stat().st_size < 2_000_000 and DATA.stat().st_size < 2_000_000


def test_optable_matches_live_dispatcher_kinds():
    """The committed table agrees with this torch's dispatcher (when built with the same torch)."""
    import torch
    from hal.capabilities.trace import kernel_kind
    table = load_optable()
    if table["provenance"]["torch"] != torch.__version__:
        pytest.skip(f"table built with torch {table['provenance']['torch']}, running {torch.__version__}")
    for op in ("aten::sum", "aten::matmul", "aten::nanmedian.dim", "aten::mode", "aten::add.Tensor"):
        kind = kernel_kind(op, "PrivateUse1")
        assert table["ops"][op]["k"] == (kind if kind in ("cia", "cea") else "-")
    assert torch._C._dispatch_has_kernel_for_dispatch_key("aten::matmul", "CompositeImplicitAutograd")
    assert torch._C._dispatch_has_kernel_for_dispatch_key("aten::sum", "CompositeExplicitAutograd")


def test_cpu_query_uses_the_live_dispatcher():
    assert op_status("cpu", "aten::mode").status == "native"
    assert op_status("cpu", "aten::matmul").status == "composite"
    assert op_status("cpu", "aten::mm", ("float64",)).dtype_notes == ()
    assert load_manifest("cpu").predicted is False


def test_live_generator_code_path_with_cpu_key(tmp_path):
    """The path the CUDA manifest is generated by, run with dispatch key CPU (a CPU-only torch has
    no CUDA kernels)."""
    out = tmp_path / "m.json"
    r = subprocess.run([sys.executable, "-m", "hal.capabilities.generate", "cuda", "--dispatch-key", "CPU",
                        "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    data = json.loads(out.read_text())
    assert "aten::mode" in data["native"]["aten"] and "aten::matmul" not in data["native"]["aten"]
    assert "--dispatch-key CPU" in data["provenance"]["generated_by"]
    st = op_status("cuda", "aten::nanmedian.dim", manifest_path=str(out))
    assert st.status == "composite" and st.predicted is False
    # no automatic CPU fallback in stock torch: an op without a kernel for the key cannot run
    st = op_status("cuda", "aten::_cudnn_rnn", manifest_path=str(out))
    assert st.status == "unsupported" and "the CPU has no kernel" in st.reason


def test_generator_bad_input_exit_2(tmp_path):
    r = subprocess.run([sys.executable, "-m", "hal.capabilities.generate", "mlu", "--kernels", str(tmp_path / "no"),
                        "--api", "x", "--env", "y"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.strip().startswith("error:") and "Traceback" not in r.stderr


def test_mlu_manifest_regenerates_identically(tmp_path):
    """The committed manifest is what its recorded command produces from the data files."""
    import pathlib
    import hal.backends.mlu
    kernels = pathlib.Path(__file__).resolve().parents[1] / KERNELS
    if not kernels.is_file():
        pytest.skip("../shared/data/mlu is not present")
    committed = json.loads((pathlib.Path(hal.backends.mlu.__file__).parent / "manifest.json").read_text())
    out = tmp_path / "m.json"
    cmd = committed["provenance"]["generated_by"].split()[3:]
    cmd = [c if not c.startswith("backends/") else str(out) for c in cmd]
    r = subprocess.run([sys.executable, "-m", "hal.capabilities.generate", *cmd], capture_output=True,
                       text=True, timeout=120, cwd=pathlib.Path(__file__).resolve().parents[1])
    assert r.returncode == 0, r.stderr
    fresh = json.loads(out.read_text())
    for key in ("native", "dtypes", "fallback", "env_map", "api_support", "collectives", "tf32_defaults"):
        assert fresh[key] == committed[key], key


def test_torch_version_pairing():
    """The MLU manifest pairs with torch 2.4; the op table was built with a newer torch."""
    from hal.capabilities import versions
    assert versions.version_for_pairing("2.4") == "2.4.0"
    assert "e4ee3be" in versions.source_of("2.4.0")
    ops24 = versions.ops_of("2.4.0")
    assert "aten::nanmedian.dim_values" in ops24 and "aten::_fused_rms_norm" not in ops24
    # newer than 2.4: torch 2.4 emits something else for the same call (version skew, issue 19): never
    # "unsupported"; unknown unless the equivalent is known (_safe_softmax -> _softmax)
    st = op_status("mlu", "aten::_fused_rms_norm", ("float32",))
    assert st.status == "unknown" and "torch 2.4.0" in st.reason and "version skew" in st.reason
    # rms_norm exists in 2.4 (CIA) but calls _fused_rms_norm only since; its 2.4 callees were not traced
    st = op_status("mlu", "aten::rms_norm", ("float32",))
    assert st.status == "composite" and "absent from torch 2.4.0" in st.reason
    assert any("rms_norm" in h for h in st.hints)  # torch_mlu's API list: F.rms_norm false
    # in torch 2.4 only (named-tensor overload removed since): no table entry to decide with
    assert op_status("mlu", "aten::align_to", ("float32",)).status == "unknown"
    # the CPU pairs with the torch it runs: no version gate
    assert op_status("cpu", "aten::_fused_rms_norm", ("float32",)).status != "unknown"


def test_torch_ops_generator_parses_autogen(tmp_path):
    y = tmp_path / "native_functions.yaml"
    y.write_text("- func: foo(Tensor self) -> Tensor\n  autogen: foo.out, foo_.x\n\n"
                 "- func: bar.Scalar(Tensor self, Scalar s) -> Tensor\n")
    out = tmp_path / "ops.txt"
    r = subprocess.run([sys.executable, "-m", "hal.capabilities.generate", "torch-ops", "--yaml", str(y),
                        "--version", "9.9.9", "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    lines = [x for x in out.read_text().splitlines() if not x.startswith("#")]
    assert lines == ["aten::bar.Scalar", "aten::foo", "aten::foo.out", "aten::foo_.x"]


def test_backend_without_manifest_is_unknown_not_an_error():
    st = op_status("no_such_backend", "aten::mm")
    assert st.status == "unknown" and "no capability manifest" in st.reason
    with pytest.raises(FileNotFoundError):
        load_manifest("no_such_backend")


def test_kernel_kind_from_the_stable_dispatcher_api():
    """kernel_kind asks _dispatch_has_kernel_for_dispatch_key in the dispatcher's precedence (no
    dispatch-table text): the same answers on torch 2.4 and the newest."""
    from hal.capabilities.trace import kernel_kind
    assert kernel_kind("aten::add.Tensor", "CPU") == "kernel"
    assert kernel_kind("aten::matmul", "PrivateUse1") == "cia" and kernel_kind("aten::matmul", "CPU") == "cia"
    assert kernel_kind("aten::sum", "PrivateUse1") == "cea"
    assert kernel_kind("aten::mm", "PrivateUse1") == "cea" and kernel_kind("aten::mm", "CPU") == "kernel"
    assert kernel_kind("aten::mode", "PrivateUse1") == "-"
    assert kernel_kind("aten::no_such_op", "CPU") == "-"
