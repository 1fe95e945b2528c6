"""Dataflow, API existence and torch-version data behind the static audit."""
import ast
import importlib

import pytest
import torch

from hal.conformance.migration import load_rules
from hal.conformance.migration.dataflow import Defs
from hal.conformance.migration.symbols import missing_symbols


def _resolve(name: str) -> bool:
    try:
        importlib.import_module(name)
        return True
    except ImportError:
        pass
    mod, _, attr = name.rpartition(".")
    try:
        return hasattr(importlib.import_module(mod), attr)
    except ImportError:
        return False


def _version_tuple(v: str) -> tuple:
    return tuple(int(p) for p in v.split("+")[0].split(".")[:2])


@pytest.mark.parametrize("name,need", sorted(load_rules("mlu").newer_apis.items()))
def test_newer_api_table_matches_the_installed_torch(name, need):
    """Under torch older than the entry the name must be absent; from that release on, present."""
    if _version_tuple(torch.__version__) >= _version_tuple(need):
        assert _resolve(name), f"{name} should exist in torch {torch.__version__}"
    else:
        assert not _resolve(name), f"{name} exists in torch {torch.__version__}, older than {need}"


def test_every_counterpart_the_mlu_rules_advise_exists_in_torch_mlu():
    rules = load_rules("mlu")
    assert len(rules.api_symbols) > 300 and "torch.mlu.cncl" in rules.api_symbols
    assert "torch.mlu.nccl" not in rules.api_symbols
    bad = {k: v for k, v in rules.api.items() if v and missing_symbols(v, rules.api_symbols)}
    assert not bad, bad
    assert missing_symbols("x = torch.mlu.nccl.all_reduce(y)", rules.api_symbols) == ["torch.mlu.nccl.all_reduce"]
    assert missing_symbols("torch.mlu.Event(enable_timing=True).query()", rules.api_symbols) == []


def _defs(src):
    tree = ast.parse(src)
    return Defs(tree), tree


@pytest.mark.parametrize("src,expr,want", [
    ("import os\nr = int(os.environ['LOCAL_RANK'])", "r", True),
    ("g = rank % torch.cuda.device_count()", "g", True),
    ("class A:\n def __init__(self, gpu_id: int):\n  self.gpu_id = gpu_id", "self.gpu_id", True),
    ("p.add_argument('--gpu', default=None, type=int)", "args.gpu", True),
    ("d = 'cuda:0'", "d", False),
    ("d = torch.device('cuda', 0)", "d", False),
    ("d = (hal_portable.device_type() + ':%d') % r", "d", False),
    ("d = 0\nd = 'cpu'", "d", False),
])
def test_integer_device_detection(src, expr, want):
    defs, _ = _defs(src)
    assert defs.is_int_device(ast.parse(expr, mode="eval").body) is want


def test_leaves_follow_strings_through_variables_and_formatting():
    defs, _ = _defs("base = 'cuda:{}'\nloc = base.format(r)\nname = f'cuda:{r}'\nx = ('cuda:1',) + args\n"
                    "m = {'cuda:0': 'cpu'}\nkind = 'cuda:%d' % r\n")
    for expr, want in [("loc", "cuda:{}"), ("kind", "cuda:%d"), ("x", "cuda:1"), ("m", "cuda:0")]:
        got = [n.value for n in defs.leaves(ast.parse(expr, mode="eval").body) if isinstance(n, ast.Constant)]
        assert want in got, (expr, got)
    leaves = list(defs.leaves(ast.parse("name", mode="eval").body))
    assert any(isinstance(n, ast.JoinedStr) for n in leaves)


def test_self_referencing_definitions_terminate():
    defs, _ = _defs("a = b\nb = a\nc = c + 'x'\n")
    assert list(defs.leaves(ast.parse("a", mode="eval").body)) == []
    assert not defs.is_int_device(ast.parse("c", mode="eval").body)
