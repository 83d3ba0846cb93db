"""The cuda backend without a GPU: its kernels under numba-cuda's simulator (conftest turns it on) on tiny
models against the reference, its decode plans replayed, PTX for every supported GPU generation, and the
one-line refusals. The backend contract suite (test_backend_contract.py) runs every op on it too, on tiny
shapes there (the simulator runs each CUDA thread as a Python thread)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from test_arch_tiny import CASES, TOKENS, build, run

from edgellm.arch import load_model
from edgellm.backends import get_backend
from edgellm.backends.cuda import CudaBackend
from edgellm.gguf import ModelFile


@pytest.fixture(scope="module")
def cb() -> CudaBackend:
    b = get_backend("cuda")
    assert isinstance(b, CudaBackend)  # never skipped: the simulator is always here
    assert b.simulated == (os.environ.get("EDGELLM_CUDA_DEVICE") != "1")
    return b


def _env_without_simulator() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env["NUMBA_ENABLE_CUDASIM"] = "0"
    return env


def _python_without_simulator(code: str, timeout: int = 300) -> subprocess.CompletedProcess:
    """`python -c code` with numba-cuda's real target (what loads its lowering registries)."""
    return subprocess.run(
        [sys.executable, "-c", code],
        env=_env_without_simulator(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_auto_never_takes_the_simulator(cb):
    assert get_backend("auto").name != "cuda"


@pytest.mark.parametrize("case", ["qwen2", "phi3"])  # biases, neox rope; fused qkv, partial rotary
def test_tiny_models_give_the_references_logits_then_decode_by_a_replayed_plan(tmp_path, cb, case):
    """Prefill of two sequences, then three decode steps of both through decode_greedy: the first records
    the step's launches, the next replay them with new token ids and positions (on a GPU the third as a
    captured CUDA graph)."""
    ref, *_ = build(tmp_path, CASES[case], "reference", qtypes={"blk.0.ffn_down.weight": T.Q8_0})
    dev = load_model(ModelFile(next(tmp_path.glob("*.gguf"))), cb)
    kv_ref, kv_dev = ref.new_kv_cache(32, 2), dev.new_kv_cache(32, 2)
    toks, pos, seqs = TOKENS[:5] + TOKENS[:3], [*range(5), *range(3)], [0] * 5 + [1] * 3
    want = run(ref, toks, pos, seqs, kv=kv_ref)
    got = run(dev, toks, pos, seqs, kv=kv_dev)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())
    nxt, at = np.array([TOKENS[5], TOKENS[3]]), np.array([5, 3])
    for step in range(3):
        args = (nxt, at + step, np.array([0, 1]))
        logits = ref.decode_step(*args, kv_ref)
        ids = dev.decode_greedy(*args, kv_dev)
        assert ids.dtype == np.int64 and list(ids) == list(np.argmax(logits, axis=1))
        nxt = ids
    plan = cb._plans[(id(dev), id(kv_dev), 2)]
    assert plan.replays >= 2 and plan.work
    if cb.simulated:
        assert plan.graph is None  # the simulator replays launch by launch
    else:
        assert plan.graph, "CUDA graph capture failed (see the log)"


def test_the_declared_weight_types_are_the_kernels_types(cb):
    from edgellm.backends.cuda import WEIGHT_TYPES
    from edgellm.backends.cuda_kernels.blocks import QK

    assert WEIGHT_TYPES == frozenset(QK)


def test_a_q8_0_kv_cache_is_refused_by_name(cb):
    with pytest.raises(ValueError, match="q8_0 KV cache"):
        cb.new_kv_cache(1, 2, 64, 32, 1, type_k="q8_0")


def test_every_kernel_compiles_to_ptx_for_turing_to_hopper():
    """numba-cuda's compile_ptx (NVVM, no GPU) for sm_75, 80, 86, 89 and 90: every kernel the backend
    launches, with the argument types its launches pass."""
    code = "from edgellm.backends.cuda_kernels.compile import compile_all; print(sorted(compile_all()))"
    out = _python_without_simulator(code, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "[(7, 5), (8, 0), (8, 6), (8, 9), (9, 0)]"


def test_backend_cuda_without_a_gpu_refuses_in_one_line(tmp_path):
    if any(os.path.exists(p) for p in ("/dev/nvidiactl", "/dev/nvidia0")):
        pytest.skip("this machine has an NVIDIA device")  # CI has none; the GPU check runs the real device
    build(tmp_path, CASES["qwen2"])
    model = str(next(tmp_path.glob("*.gguf")))
    out = subprocess.run(
        [sys.executable, "-m", "edgellm", "run", model, "--backend", "cuda", "--raw", "-p", "hi", "-n", "1"],
        env={**_env_without_simulator(), "EDGELLM_OFFLINE": "1", "EDGELLM_HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode != 0
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert lines == ["error: cuda: no NVIDIA GPU here (no /dev/nvidia* device)"], out.stderr


def test_auto_on_the_native_backend_never_imports_numba(tmp_path):
    """Asking whether cuda is there (auto does on every load) reads the simulator switch without importing
    numba: a server on the native backend stays ~40 MB and 0.4 s lighter (the Pi unit's RSS test)."""
    build(tmp_path, CASES["qwen2"])
    model = str(next(tmp_path.glob("*.gguf")))
    code = (
        "import sys, edgellm; llm = edgellm.LLM(sys.argv[1]); "
        "print(llm.backend.name, 'numba' in sys.modules, 'numba.cuda' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code, model], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["native", "False", "False"]


def test_a_numba_cuda_that_does_not_load_with_this_numpy_is_refused_by_name(tmp_path, monkeypatch):
    """A numba-cuda and numpy that clash fail at the first kernel compile (on an H100 machine: numpy 2.5's
    missing np.row_stack, now put back); the backend refuses such a pair before it loads anything, in one
    line. A module raising that error stands in for the registries."""
    from edgellm.backends import cuda as cuda_backend

    out = _python_without_simulator(
        "from edgellm.backends.cuda import registries_refusal; print(registries_refusal())"
    )
    assert (out.returncode, out.stdout.strip()) == (0, "None"), out.stderr[-2000:]  # the pair installed here
    (tmp_path / "clashing_registries.py").write_text(
        "raise AttributeError(\"module 'numpy' has no attribute 'row_stack'\")\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(cuda_backend, "REGISTRIES", "clashing_registries")
    why = cuda_backend.registries_refusal()
    assert why is not None and why.startswith("cuda: numba-cuda")
    assert "numpy" in why and "row_stack" in why and "\n" not in why


def test_numba_cuda_loads_on_a_numpy_without_row_stack():
    """numpy 2.5 removed np.row_stack, which numba-cuda 0.30's registries overload: every kernel compile
    failed on an H100 machine's numpy 2.5.2. The cuda kernels' package puts the alias back (np.vstack, as
    numpy had it); here numpy's own alias (2.4 and older) is removed first, as 2.5 has it."""
    code = (
        "import numpy as np; vars(np).pop('row_stack', None); import edgellm.backends.cuda_kernels; "
        "import numba.cuda.cudaimpl; print(np.row_stack is np.vstack)"
    )
    out = _python_without_simulator(code)
    assert (out.returncode, out.stdout.strip()) == (0, "True"), out.stderr[-2000:]
