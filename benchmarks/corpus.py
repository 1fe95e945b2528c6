"""Corpus benchmark: `hal-audit --device mlu` on public CUDA training/inference programs, unchanged.

The programs are NOT in this repository: fetch them first (outside it) and point --corpus there:

    git clone https://github.com/karpathy/nanoGPT   $CORPUS/nanoGPT
    git clone https://github.com/karpathy/minGPT    $CORPUS/minGPT
    git clone https://github.com/pytorch/examples   $CORPUS/examples
    git clone https://github.com/karpathy/llm.c     $CORPUS/llm.c
    python benchmarks/corpus.py --corpus $CORPUS [--only NAME ...] [--out reports/corpus/corpus.json]

Each program is copied (without .git) into a scratch folder, given a tiny generated dataset where
it needs one (nothing is downloaded), and audited with small arguments, a --steps bound and a
--timeout. With ``--sections`` the audit adds ``--precision --profile`` and the table (``sections.md``) says
what those sections found: verdict, first divergence, outputs compared, the compared window and the profile's
overhead (:func:`section_fields`); :data:`SECTION_ARGS` gives programs the iterations the profile needs. The table: program, exit code, run.status, stopped_by, ops, seconds, the first error
line; the JSON adds the repository commit of every program, the torch version and the command.

Each row runs under the interpreter :data:`RUNS_UNDER` names for it (``--python KIND=PATH``; by
default ``.venvv/bin/python`` for ``tv`` and ``.venv24/bin/python`` for ``t24`` in this checkout,
else the interpreter running this script), and the table says which torch that was.
``--all-under PATH`` runs every row under one interpreter instead: the corpus on torch 2.4.1, the torch
torch_mlu r2.4 users run (``reports/corpus/corpus-torch24.md``).

Cause of a failure: "environment" when the program's own dependency is not installed here
(torchvision, matplotlib, tiktoken: it would fail the same way on a CUDA machine without it);
otherwise the program is also run plainly (``python script args``, no auditor, in a fresh copy with
the same data and interpreter): "program (fails without the audit too)" when that fails with the same
exception, else "audit or program". The audit is never blamed for a program's own failure.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import pickle
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent

# -- tiny datasets ---------------------------------------------------------------------------------


def _nanogpt_data(work: Path) -> None:
    d = work / "data" / "tiny"
    d.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        rng.integers(0, 64, size=4096, dtype=np.uint16).tofile(d / f"{split}.bin")
    with open(d / "meta.pkl", "wb") as f:
        pickle.dump({"vocab_size": 64}, f)


def _cora_data(work: Path, nodes: int = 1800, features: int = 100, edges: int = 3600) -> None:
    """gat's ``./cora`` (it downloads Cora only where the folder lacks it): ``cora.content`` (paper id, binary word
    features, class) and ``cora.cites`` (id pairs), random, with more nodes than its 1600 held out of training."""
    rng = np.random.default_rng(0)
    d = work / "cora"
    d.mkdir(parents=True, exist_ok=True)
    ids = rng.permutation(100000)[:nodes] + 1
    with open(d / "cora.content", "w") as f:
        for i in ids:
            words = "\t".join(map(str, (rng.random(features) < 0.05).astype(int)))
            f.write(f"{i}\t{words}\tclass{rng.integers(7)}\n")
    with open(d / "cora.cites", "w") as f:
        for a, b in (rng.choice(ids, 2, replace=False) for _ in range(edges)):
            f.write(f"{a}\t{b}\n")


def _chargpt_data(work: Path) -> None:
    (work / "input.txt").write_text("O God, O God! the quick brown fox jumps over the lazy dog.\n" * 200)


def _wlm_data(work: Path) -> None:
    d = work / "data" / "wikitext-2"
    valid = (d / "valid.txt").read_text().splitlines()[:400]
    for name in ("train.txt", "valid.txt", "test.txt"):
        (d / name).write_text("\n".join(valid[:300] if name == "train.txt" else valid[300:]) + "\n")


def _llmc_data(work: Path) -> None:
    d = work / "dev" / "data" / "tinyshakespeare"
    d.mkdir(parents=True, exist_ok=True)
    header = np.zeros(256, dtype=np.int32)
    header[0], header[1], header[2] = 20240520, 1, 8192
    tokens = np.random.default_rng(0).integers(0, 50257, size=8192, dtype=np.uint16)
    with open(d / "tiny_shakespeare_val.bin", "wb") as f:
        f.write(header.tobytes())
        f.write(tokens.tobytes())


def _mnist_data(work: Path, root: str = "../data") -> None:
    """A small MNIST in torchvision's raw format at ``<root>/MNIST/raw`` (``../data``: where mnist and vae look),
    so ``download=True`` finds it and downloads nothing: random 28x28 images, random labels."""
    raw = work / root / "MNIST" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for prefix, n in (("train", 256), ("t10k", 64)):
        with open(raw / f"{prefix}-images-idx3-ubyte", "wb") as f:
            f.write(np.array([2051, n, 28, 28], dtype=">i4").tobytes())
            f.write(rng.integers(0, 256, size=n * 28 * 28, dtype=np.uint8).tobytes())
        with open(raw / f"{prefix}-labels-idx1-ubyte", "wb") as f:
            f.write(np.array([2049, n], dtype=">i4").tobytes())
            f.write(rng.integers(0, 10, size=n, dtype=np.uint8).tobytes())


def _sine_data(work: Path) -> None:
    """traindata.pt as the example's own generate_sine_wave.py makes it (a pickled float64 numpy array of
    noisy sine waves), with 8 waves of 100 points instead of 100 of 1000 (its full size takes minutes here)."""
    import torch
    rng = np.random.default_rng(2)
    x = np.arange(100)[None, :] + rng.integers(-80, 80, size=(8, 1))
    torch.save(np.sin(x / 20.0).astype("float64"), str(work / "traindata.pt"))


NANO = ["--dataset=tiny", "--batch_size=2", "--block_size=32", "--n_layer=2", "--n_head=2", "--n_embd=32",
        "--max_iters=4", "--eval_interval=2", "--eval_iters=2", "--log_interval=1",
        "--gradient_accumulation_steps=1", "--always_save_checkpoint=False", "--out_dir=out-tiny"]
WLM = ["--epochs", "1", "--emsize", "16", "--nhid", "16", "--nlayers", "1", "--bptt", "8", "--batch_size", "4",
       "--log-interval", "5", "--accel"]
DDP_ENV = {"LOCAL_RANK": "0", "RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29533"}

#: name, repository, folder copied, script (relative to the folder), args, data maker, steps, env
PROGRAMS = [
    ("nanoGPT train.py (compile off)", "nanoGPT", ".", "train.py", [*NANO, "--compile=False"], _nanogpt_data, 3, {}),
    ("nanoGPT train.py (compile on)", "nanoGPT", ".", "train.py", [*NANO, "--compile=True"], _nanogpt_data, 3, {}),
    ("minGPT chargpt", "minGPT", ".", "projects/chargpt/chargpt.py",
     ["--trainer.max_iters=20", "--trainer.batch_size=4", "--model.model_type=gpt-nano", "--data.block_size=32",
      "--trainer.num_workers=0"], _chargpt_data, 3, {}),
    ("minGPT adder", "minGPT", ".", "projects/adder/adder.py",
     ["--trainer.max_iters=20", "--trainer.batch_size=8", "--trainer.num_workers=0"], None, 3, {}),
    ("examples word_language_model LSTM (manual SGD)", "examples", "word_language_model", "main.py", WLM,
     _wlm_data, 2, {}),
    ("examples word_language_model Transformer", "examples", "word_language_model", "main.py",
     [*WLM, "--model", "Transformer", "--nhead", "2"], _wlm_data, 2, {}),
    ("examples word_language_model LSTM --use-optimizer", "examples", "word_language_model", "main.py",
     [*WLM, "--use-optimizer", "--lr", "0.001"], _wlm_data, 2, {}),
    ("examples ddp-tutorial single_gpu", "examples", "distributed/ddp-tutorial-series", "single_gpu.py",
     ["2", "1", "--batch_size", "32"], None, 3, {}),
    ("examples ddp-tutorial multigpu (mp.spawn, nccl)", "examples", "distributed/ddp-tutorial-series", "multigpu.py",
     ["2", "1", "--batch_size", "32"], None, 3, {}),
    ("examples ddp-tutorial multigpu_torchrun (nccl)", "examples", "distributed/ddp-tutorial-series",
     "multigpu_torchrun.py", ["2", "1", "--batch_size", "32"], None, 3, DDP_ENV),
    # torchrun programs that check for two GPUs first ("Unable to locate sufficient 2 gpus"): rank 0 of a world of one,
    # the audit telling them of two devices (AUDIT_OPTIONS)
    ("examples distributed/ddp example.py (--devices 2)", "examples", "distributed/ddp", "example.py", [], None, 2,
     {**DDP_ENV, "LOCAL_WORLD_SIZE": "1", "MASTER_PORT": "29534"}),
    ("examples distributed/FSDP2 example.py (--devices 2)", "examples", "distributed/FSDP2", "example.py", [], None,
     3, {**DDP_ENV, "LOCAL_WORLD_SIZE": "1", "MASTER_PORT": "29535"}),
    # torchrun programs of several ranks, each rank audited (TORCHRUN); each checks for its GPUs (AUDIT_OPTIONS)
    ("examples tensor_parallelism tensor_parallel_example.py (torchrun, 2 ranks)", "examples",
     "distributed/tensor_parallelism", "tensor_parallel_example.py", [], None, 3, {}),
    ("examples tensor_parallelism sequence_parallel_example.py (torchrun, 2 ranks)", "examples",
     "distributed/tensor_parallelism", "sequence_parallel_example.py", [], None, 3, {}),
    ("examples tensor_parallelism fsdp_tp_example.py (torchrun, 4 ranks)", "examples",
     "distributed/tensor_parallelism", "fsdp_tp_example.py", [], None, 3, {}),
    ("examples regression", "examples", "regression", "main.py", [], None, 3, {}),
    ("examples time_sequence_prediction", "examples", "time_sequence_prediction", "train.py", ["--steps", "1"],
     _sine_data, 2, {}),
    ("examples mnist", "examples", "mnist", "main.py", ["--epochs", "1", "--dry-run"], _mnist_data, 2, {}),
    ("examples dcgan", "examples", "dcgan", "main.py", ["--dataset", "fake", "--niter", "1", "--dry-run",
                                                       "--batchSize", "4", "--imageSize", "64"], None, 2, {}),
    ("examples vae", "examples", "vae", "main.py", ["--epochs", "1"], _mnist_data, 2, {}),
    ("examples imagenet (--dummy)", "examples", "imagenet", "main.py",
     ["--dummy", "-a", "resnet18", "-b", "2", "--epochs", "1", "--workers", "0"], None, 2, {}),
    # trains in two plain mp.Process workers (spawn start method), each redirected and audited
    ("examples mnist_hogwild (2 spawn processes)", "examples", "mnist_hogwild", "main.py",
     ["--epochs", "1", "--dry-run", "--num-processes", "2", "--cuda"], _mnist_data, 2, {}),
    # its test loader forks a DataLoader worker after the first forward (the precision reference's tracer was in it)
    ("examples siamese_network", "examples", "siamese_network", "main.py",
     ["--epochs", "1", "--dry-run", "--batch-size", "16", "--test-batch-size", "16"], _mnist_data, 2, {}),
    ("examples mnist_rnn (LSTM)", "examples", "mnist_rnn", "main.py",
     ["--epochs", "1", "--dry-run", "--accel", "--batch-size", "16", "--test-batch-size", "16"], _mnist_data, 2, {}),
    ("examples mnist_forward_forward", "examples", "mnist_forward_forward", "main.py",
     ["--epochs", "3", "--train_size", "256", "--test_size", "64", "--log-interval", "1"],
     functools.partial(_mnist_data, root="data"), 3, {}),
    # graph attention on a dense adjacency, the Cora-format data generated (gcn, beside it, downloads Cora every run)
    ("examples gat (generated Cora)", "examples", "gat", "main.py",
     ["--epochs", "4", "--hidden-dim", "16", "--num-heads", "2", "--val-every", "100"], _cora_data, 2, {}),
    ("llm.c train_gpt2.py (d12 random init)", "llm.c", ".", "train_gpt2.py",
     ["--model", "d12", "--write_tensors", "0", "--num_iterations", "3", "--batch_size", "1",
      "--sequence_length", "32", "--device", "cuda"], _llmc_data, 2, {}),
]

#: program -> ranks: ``torchrun --standalone --nproc-per-node N`` starts N workers, each running hal-audit on the
#: program with its own ``--out`` (``hal-audit-out-<RANK>``), as docs/runtime-audit.md says to audit torchrun
#: programs; the row is rank 0's report, every rank's status is in its ``workers``
TORCHRUN = {"examples tensor_parallelism tensor_parallel_example.py (torchrun, 2 ranks)": 2,
            "examples tensor_parallelism sequence_parallel_example.py (torchrun, 2 ranks)": 2,
            "examples tensor_parallelism fsdp_tp_example.py (torchrun, 4 ranks)": 4}
#: program -> hal-audit options of its own (before the program's arguments); a torchrun program checks for a GPU
#: per rank, so it is told of as many devices as it has ranks
AUDIT_OPTIONS = {"examples distributed/ddp example.py (--devices 2)": ["--devices", "2"],
                 "examples distributed/FSDP2 example.py (--devices 2)": ["--devices", "2"],
                 **{name: ["--devices", str(ranks)] for name, ranks in TORCHRUN.items()}}
#: program -> why it fails here, where the cause is known and is not the audit's (the plain run cannot show it: a
#: program that needs N GPUs exits early without the audit's --devices)
KNOWN_CAUSES: dict = {}

#: program -> its arguments for ``--sections`` (the profile's schedule needs 3 + 2 x --steps training steps of the
#: program on the CPU, and an evaluation inside a timed step skews its time: more iterations, no evaluation between)
SECTION_ARGS = {
    **{name: [*NANO, f"--compile={flag}", "--max_iters=16", "--eval_interval=100"]
       for name, flag in (("nanoGPT train.py (compile off)", False), ("nanoGPT train.py (compile on)", True))},
    "examples time_sequence_prediction": ["--steps", "8"],
    # --dry-run stops after one batch; the 256 synthetic images in batches of 16 are 16 steps
    "examples mnist": ["--epochs", "1", "--batch-size", "16"],
    "examples vae": ["--epochs", "1", "--batch-size", "16"],
    "examples siamese_network": ["--epochs", "1", "--batch-size", "16", "--test-batch-size", "16"],
    "examples gat (generated Cora)": ["--epochs", "12", "--hidden-dim", "16", "--num-heads", "2", "--val-every", "100"],
    "examples mnist_rnn (LSTM)": ["--epochs", "1", "--accel", "--batch-size", "16", "--test-batch-size", "16"],
    # one optimizer step per layer and epoch (two layers): 8 epochs are 16 steps
    "examples mnist_forward_forward": ["--epochs", "8", "--train_size", "256", "--test_size", "64",
                                       "--log-interval", "100"],
    # FakeData's 1000 images in batches of 4: 250 iterations of two optimizer steps each (D, then G)
    "examples dcgan": ["--dataset", "fake", "--niter", "1", "--batchSize", "4", "--imageSize", "64"],
}

_ENV_ERRORS = ("ModuleNotFoundError", "No module named")

#: program -> (interpreter kind, why). Rows not listed run under the interpreter running this script.
RUNS_UNDER = {
    **{name: ("tv", "torchvision pairs with one torch release: 0.29.1 needs torch 2.14.1, and 0.28.0 beside torch "
                    "2.13's CPU build fails to register its C++ ops (torchvision::nms); these rows ran under torch "
                    "2.14.1 + torchvision 0.29.1, except dcgan's sections row (2.4.1 + 0.19.1; mnist, vae and "
                    "imagenet call torch.accelerator, which torch 2.4 lacks, without the audit too)")
       for name in ("examples mnist", "examples dcgan", "examples vae", "examples imagenet (--dummy)",
                    "examples mnist_hogwild (2 spawn processes)", "examples siamese_network",
                    "examples mnist_rnn (LSTM)", "examples mnist_forward_forward")},
    "examples time_sequence_prediction": (
        "t24", "its torch.load of a pickled numpy array fails on torch >= 2.6 (weights_only=True by default) "
               "without the audit too; torch 2.4.1 is the torch torch_mlu users run"),
}
#: the interpreters of each kind where the README sets them up (`--python KIND=PATH` replaces them)
_DEFAULT_VENVS = {"tv": ".venv-tv214", "t24": ".venv-torch24"}


def _commit(repo: Path) -> str:
    try:
        return subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _first_error(report: dict, stderr: str) -> str:
    run = report.get("run") or {}
    err = run.get("error") or ""
    if not err and stderr.strip() and run.get("status") != "ok":  # (torchrun's banner on an ok run's stderr)
        err = stderr.strip().splitlines()[-1]
    return " ".join(str(err).split())[:160]


def run_program(entry: tuple, corpus: Path, scratch: Path, timeout: float, python: str,
                sections: bool = False) -> dict:
    """One program audited (``sections``: with ``--precision --profile``): the row of the table."""
    name, repo, folder, script, args, data, steps, env = entry
    src = corpus / repo
    row = {"program": name, "repo": repo, "script": f"{folder}/{script}".lstrip("./"), "commit": _commit(src),
           "args": args, "steps": steps}
    if not src.is_dir():
        return {**row, "exit": None, "status": "not fetched", "ops": 0, "seconds": 0.0,
                "error": f"{src} missing", "cause": "environment"}
    work = scratch / "".join(c if c.isalnum() else "_" for c in name)
    shutil.copytree(src / folder, work, ignore=shutil.ignore_patterns(".git"), dirs_exist_ok=True)
    if data is not None:
        data(work)
    out = work / "hal-audit-out"
    exe = Path(python).parent / "hal-audit"
    ranks = TORCHRUN.get(name)
    cmd = [str(exe), script, "--device", "mlu", "--steps", str(steps), "--timeout", str(timeout),
           "--out", str(out), "--format", "json", *(["--precision", "--profile"] if sections else []),
           *AUDIT_OPTIONS.get(name, []), "--", *args]
    if ranks:  # each torchrun worker audits the program into its own folder (a wrapper expands $RANK)
        cmd[cmd.index("--out") + 1] = f"{out}-$RANK"
        wrapper = work / "hal-audit-rank.sh"
        wrapper.write_text("#!/bin/sh\nexec " + " ".join(a if a.endswith("-$RANK") else shlex.quote(a)
                                                        for a in cmd) + "\n")
        wrapper.chmod(0o755)
        launch = [python, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks),
                  "--no-python", str(wrapper)]
    t0 = time.monotonic()
    p = subprocess.run(launch if ranks else cmd, cwd=work, capture_output=True, text=True,
                       env={**os.environ, **env}, timeout=timeout + 120)
    seconds = round(time.monotonic() - t0, 1)
    try:
        report = json.loads((Path(f"{out}-0") / "audit.json").read_text() if ranks else p.stdout)
    except (OSError, ValueError):
        report = {}
    run = report.get("run") or {}
    error = _first_error(report, p.stderr)
    tail = " ".join(run.get("output_tail") or [])
    plain: dict = {}
    if ranks:  # every rank's status as the row's workers
        run = {**run, "spawned": [_rank_report(Path(f"{out}-{r}"), r) for r in range(ranks)]}
    if run.get("status") == "ok":
        cause = ""
    elif any(e in error or e in tail for e in _ENV_ERRORS):
        cause = "environment"
    elif name in KNOWN_CAUSES:
        cause = KNOWN_CAUSES[name]
    else:
        plain = run_plainly(entry, corpus, scratch / "plain", timeout, python)
        same = plain["exit"] != 0 and _exception(error) and _exception(error) == _exception(plain["error"])
        cause = "program (fails without the audit too)" if same else "audit or program"
    return {**row, "exit": p.returncode, "status": run.get("status", "-"), "stopped_by": run.get("stopped_by"),
            "ops": len(report.get("ops") or []), "seconds": seconds, "error": error, "cause": cause,
            "runtime_findings": sum(1 for f in report.get("findings") or [] if f.get("rule", "").startswith("runtime-")),
            "workers": [{k: w.get(k) for k in ("rank", "process", "status", "steps", "error")}
                        for w in run.get("spawned") or []],
            "command": (f"torchrun --standalone --nproc-per-node {ranks} --no-python <each rank: " if ranks else "")
            + " ".join(["hal-audit", *cmd[1:]]) + (">" if ranks else ""),
            **(section_fields(report) if sections else {}),
            **({"plain_exit": plain["exit"], "plain_error": plain["error"]} if plain else {})}


def _rank_report(out: Path, rank: int) -> dict:
    """A torchrun rank's run (TORCHRUN) as a worker of the row: rank, status, steps, error."""
    try:
        run = json.loads((out / "audit.json").read_text()).get("run") or {}
    except (OSError, ValueError):
        return {"rank": rank, "status": "no report", "steps": None, "error": f"{out / 'audit.json'} missing"}
    return {"rank": rank, "status": run.get("status"), "steps": run.get("steps"), "error": run.get("error")}


def section_fields(report: dict) -> dict:
    """What ``--precision --profile`` produced for one program: the precision verdict, its first divergence, how
    many op outputs were compared against the float64 run and why others were not, the compared window against a
    later plain step; the profile's plain and profiled step, its ratio and its errors."""
    pr, pf = report.get("precision") or {}, report.get("profile") or {}
    summ, timing = pr.get("summary") or {}, (pr.get("target") or {}).get("timing") or {}
    fd = pr.get("first_divergence") or {}
    after = timing.get("after_window_step_ms") or []
    step, prof = (pf.get("step_ms") or {}).get("median"), (pf.get("profiled_step_ms") or {}).get("median")
    return {"precision": {"verdict": pr.get("verdict", "absent"), "error": pr.get("error"),
                          "first_divergence": f"{fd['module']} {fd['op']} ({fd.get('kind')}, {fd.get('phase')})"
                          if fd else None,
                          "ops": summ.get("ops"), "shadowed": summ.get("shadowed"),
                          "matched_reference": summ.get("matched_reference"),
                          "gradients": summ.get("gradients"), "parameters": summ.get("parameters"),
                          "compared_window": (pr.get("target") or {}).get("compared_window"),
                          "not_compared": pr.get("not_compared") or [],
                          "verdict_reasons": summ.get("verdict_reasons") or [], "window_ms": timing.get("window_ms"),
                          "after_window_step_ms": after,
                          "window_vs_step": timing["window_ms"] / min(after) if after and timing.get("window_ms")
                          else None},
            "profile": {"present": "step_ms" in pf, "error": pf.get("error"), "step_ms": step,
                        "profiled_step_ms": prof, "ratio": prof / step if step and prof else None,
                        "trace": pf.get("trace"), "errors": pf.get("errors") or []}}


def _exception(error: str) -> str:
    """The exception name an error line starts with (``UnpicklingError``), or ''."""
    head = error.split(":", 1)[0].strip()
    return head.rsplit(".", 1)[-1] if head.replace(".", "").replace("_", "").isalnum() else ""


def run_plainly(entry: tuple, corpus: Path, scratch: Path, timeout: float, python: str) -> dict:
    """The program as its users run it, without the auditor: ``{"exit", "error"}`` (the last line of
    its stderr; "timeout" after ``timeout`` s). On this machine a CUDA-only program may fail for lack
    of CUDA: only the same exception as under the audit counts as the program's own failure."""
    name, repo, folder, script, args, data, _steps, env = entry
    work = scratch / "".join(c if c.isalnum() else "_" for c in name)
    shutil.copytree(corpus / repo / folder, work, ignore=shutil.ignore_patterns(".git"), dirs_exist_ok=True)
    if data is not None:
        data(work)
    try:
        p = subprocess.run([python, script, *args], cwd=work, capture_output=True, text=True,
                           env={**os.environ, **env}, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"exit": None, "error": f"timeout after {timeout:g} s"}
    lines = [ln for ln in p.stderr.strip().splitlines() if ln.strip()]
    return {"exit": p.returncode, "error": " ".join(lines[-1].split())[:160] if p.returncode and lines else ""}


def interpreters(given: list[str]) -> dict[str, str]:
    """``{kind: python}`` from ``--python KIND=PATH`` and the default venvs of this checkout."""
    out = {kind: str(ROOT / venv / "bin" / "python") for kind, venv in _DEFAULT_VENVS.items()
           if (ROOT / venv / "bin" / "python").exists()}
    for item in given:
        kind, _, path = item.partition("=")
        if not path:
            raise SystemExit(f"corpus.py: --python wants KIND=PATH, not {item!r}")
        out[kind] = os.path.abspath(path)  # the programs run from their own folders
    return out


_TORCH: dict[str, str] = {}


def torch_version(python: str) -> str:
    if python not in _TORCH:
        p = subprocess.run([python, "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True)
        _TORCH[python] = p.stdout.strip() or "?"
    return _TORCH[python]


def _selects(pattern: str, name: str) -> bool:
    """Whether ``--only`` ``pattern`` selects program ``name``: the whole name of a program selects it alone, any other
    pattern every name it is a substring of (case-insensitive)."""
    p = pattern.lower()
    if any(p == q[0].lower() for q in PROGRAMS):
        return p == name.lower()
    return p in name.lower()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", default=os.environ.get("HAL_CORPUS", "/work/corpus"))
    ap.add_argument("--out", help="default reports/corpus/corpus.json, with --sections reports/corpus/sections.json")
    ap.add_argument("--sections", action="store_true",
                    help="audit with --precision --profile and tabulate those sections (issue 17)")
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--only", nargs="*", help="substrings of program names to run (a whole name selects that program "
                                              "alone: 'examples mnist' is not also mnist_rnn)")
    ap.add_argument("--merge", action="store_true", help="keep the other programs' rows already in --out")
    ap.add_argument("--python", action="append", default=[], metavar="KIND=PATH",
                    help="the interpreter for the rows RUNS_UNDER gives that kind (tv, t24)")
    ap.add_argument("--all-under", metavar="PATH",
                    help="run every row under this interpreter instead (RUNS_UNDER ignored): the whole corpus on one "
                         "torch, e.g. torch 2.4.1 with torchvision 0.19.1 (reports/corpus/corpus-torch24.json)")
    a = ap.parse_args()
    a.out = a.out or f"reports/corpus/{'sections' if a.sections else 'corpus'}.json"
    pythons = interpreters(a.python)
    progs = [p for p in PROGRAMS if not a.only or any(_selects(s, p[0]) for s in a.only)]
    rows = []
    with tempfile.TemporaryDirectory(prefix="hal-corpus-") as d:
        for entry in progs:
            kind, why = RUNS_UNDER.get(entry[0], (None, "")) if not a.all_under else (None, "")
            python = pythons.get(kind, sys.executable) if kind else sys.executable
            if a.all_under:
                python = os.path.abspath(a.all_under)
            if kind and kind not in pythons:
                print(f"{entry[0]}: no {kind} interpreter (--python {kind}=PATH); using {sys.executable}", flush=True)
            if a.sections and entry[0] in SECTION_ARGS:
                entry = (*entry[:4], SECTION_ARGS[entry[0]], *entry[5:])
            row = {**run_program(entry, Path(a.corpus), Path(d), a.timeout, python, a.sections), "torch": torch_version(python),
                   **({"runs_under": why} if kind in pythons else {})}
            rows.append(row)
            print(f"{row['program']}: exit {row['exit']} {row['status']} ops {row['ops']} {row['seconds']} s "
                  f"{row['error'][:100]}", flush=True)
    if a.merge and Path(a.out).is_file():
        fresh = {r["program"]: r for r in rows}
        previous = json.loads(Path(a.out).read_text())
        old = [{"torch": previous["meta"].get("torch", "?"), **r} for r in previous["results"]]
        rows = [fresh.pop(r["program"], {**r, "kept": True}) for r in old] + list(fresh.values())
        order = {p[0]: i for i, p in enumerate(PROGRAMS)}  # the table in PROGRAMS' order, new rows in their place
        rows.sort(key=lambda r: order.get(r["program"], len(order)))
    meta = {"torch": ", ".join(sorted({r.get("torch", "?") for r in rows})),
            "python": platform.python_version(), "platform": platform.platform(),
            "corpus": a.corpus, "timeout_s": a.timeout,
            **({"options": f" --all-under {a.all_under}"} if a.all_under else {})}
    (write_section_tables if a.sections else write_tables)(rows, meta, Path(a.out))


def _fmt(x, spec: str = ".1f") -> str:
    return "-" if x is None else format(x, spec)


def write_section_tables(rows: list[dict], meta: dict, out: Path) -> None:
    """Print the ``--sections`` table and write ``out`` (JSON) and ``out`` with suffix .md."""
    from tabulate import tabulate
    table = []
    for r in rows:
        pr, pf = r.get("precision") or {}, r.get("profile") or {}
        table.append([r["program"], r.get("torch", meta["torch"]), r["exit"], r["status"], pr.get("verdict", "-"),
                      pr.get("first_divergence") or "-",
                      f"{pr.get('matched_reference')}/{pr.get('ops')}" if pr.get("ops") is not None else "-",
                      f"{pr.get('shadowed')}/{pr.get('ops')}" if pr.get("ops") is not None else "-",
                      _fmt(pr.get("window_ms")), _fmt(min(pr.get("after_window_step_ms") or [None], key=lambda v: v or 0)),
                      _fmt(pr.get("window_vs_step")), _fmt(pf.get("step_ms"), ".2f"), _fmt(pf.get("ratio"), ".2f"),
                      "yes" if pf.get("trace") else "no", len(pf.get("errors") or []), r["seconds"]])
    table = tabulate(table, headers=["program", "torch", "exit", "run", "precision", "first divergence",
                                     "compared/recorded", "shadowed/recorded", "window ms", "step ms", "window/step", "profile step ms",
                                     "profiled/plain", "trace", "profile errors", "seconds"], tablefmt="github")
    both = sum(bool((r.get("precision") or {}).get("ops")) and (r.get("profile") or {}).get("present") for r in rows)
    failing = sum(bool((r.get("profile") or {}).get("errors")) for r in rows)
    summary = f"{both}/{len(rows)} programs with both sections; {failing} with profile errors"
    print(table)
    print(summary)
    meta = {**meta, "summary": summary}
    os.makedirs(out.parent, exist_ok=True)
    out.write_text(json.dumps({"meta": meta, "results": rows}, indent=2))
    md = ["# Corpus: hal-audit --device mlu --precision --profile on public CUDA programs", "",
          f"torch {meta['torch']}, Python {meta['python']}, {meta['platform']}; CPU only: the programs ran "
          f"redirected to the CPU, so both sections are measured on the CPU, not on an MLU. Generated by `python "
          f"benchmarks/corpus.py --sections{meta.get('options', '')}`. Columns: the precision verdict against the float64 reference run and "
          f"its first divergence (module, op, how, phase); op outputs compared against the reference run / recorded "
          f"in the compared window; recorded outputs with a float64 shadow (their local error; the others say why "
          f"in the JSON report); the "
          f"compared window (first optimizer step, float64 shadows and statistics included) against the fastest "
          f"later plain step of the same run; the profile's median plain step, profiled/plain and the errors its "
          f"steps met (`profile.errors` in the JSON, also below). Arguments: the "
          f"corpus table's, except where the JSON's `args` differ (`SECTION_ARGS`: enough iterations for the "
          f"profile's schedule, no evaluation inside a timed step).", "",
          table, "", summary, "", "Not compared, per program (the report's reasons):", ""]
    for r in rows:
        for why in (r.get("precision") or {}).get("not_compared") or []:
            md.append(f"- {r['program']}: {why}")
    reasons = [f"- {r['program']}: {r['precision']['verdict']}: {why}" for r in rows
               for why in (r.get("precision") or {}).get("verdict_reasons") or []]
    md += ["", "Why a precision verdict is not pass (the report's `summary.verdict_reasons`):", "", *reasons] \
        if reasons else []
    errors = [f"- {r['program']}: {e}" for r in rows for e in (r.get("profile") or {}).get("errors") or []]
    md += ["", "Profile errors:", "", *errors] if errors else []
    md += ["", "Programs came from (never committed here):", ""]
    md += [f"- {repo} @ {commit}" for repo, commit in sorted({(r["repo"], r["commit"]) for r in rows})]
    out.with_suffix(".md").write_text("\n".join(md) + "\n")
    print(f"wrote {out} and {out.with_suffix('.md')}")


def write_tables(rows: list[dict], meta: dict, out: Path) -> None:
    """Print the table and write ``out`` (JSON) and ``out`` with suffix .md."""
    from tabulate import tabulate
    table = tabulate([[r["program"], r.get("torch", meta["torch"]), r["exit"], r["status"], r.get("stopped_by") or "-",
                       r["ops"], r["seconds"], (r.get("cause") or "-").split(":")[0], r["error"][:90] or "-"]
                      for r in rows],
                     headers=["program", "torch", "exit", "run.status", "stopped by", "ops", "seconds", "cause",
                              "first error"],
                     tablefmt="github")
    ok = sum(r["status"] == "ok" for r in rows)
    env_fail = sum(r.get("cause") == "environment" for r in rows)
    own_fail = sum(str(r.get("cause")).startswith("program") for r in rows)
    emulated = sum(str(r.get("cause")).startswith("CPU emulation") for r in rows)
    summary = (f"{ok}/{len(rows)} ok; {env_fail} failed for a dependency not installed here; {own_fail} failed "
               f"without the audit too; {emulated} failed where torch's CPU path lacks what CUDA has (KNOWN_CAUSES); "
               f"{len(rows) - ok - env_fail - own_fail - emulated} other failures")
    print(table)
    print(summary)
    meta = {**meta, "summary": summary}
    os.makedirs(out.parent, exist_ok=True)
    out.write_text(json.dumps({"meta": meta, "results": rows}, indent=2))
    commits = sorted({(r["repo"], r["commit"]) for r in rows})
    md = ["# Corpus: hal-audit --device mlu on public CUDA programs", "",
          f"torch {meta['torch']} (the torch column says which ran each row; the notes below say why a row "
          f"ran under another torch), Python {meta['python']}, {meta['platform']}; CPU only (every MLU status is "
          f"predicted). Generated by `python benchmarks/corpus.py{meta.get('options', '')}`.",
          "", table, "", summary, ""]
    notes = [f"- {r['program']}: torch {r.get('torch')}: {r['runs_under']}" for r in rows if r.get("runs_under")]
    notes += [f"- {r['program']}: {r['cause']}" for r in rows if ":" in (r.get("cause") or "")]
    notes += [f"- {r['program']}: kept from an earlier run (not run this time)" for r in rows if r.get("kept")]
    notes += [f"- {r['program']}: without the audit, exit {r['plain_exit']}: {r.get('plain_error') or '-'}"
              for r in rows if "plain_exit" in r]
    md += (["Notes:", "", *notes, ""] if notes else []) + [
          "Programs came from (never committed here):", ""]
    md += [f"- {repo} @ {commit}" for repo, commit in commits]
    out.with_suffix(".md").write_text("\n".join(md) + "\n")
    print(f"wrote {out} and {out.with_suffix('.md')}")


if __name__ == "__main__":
    main()
