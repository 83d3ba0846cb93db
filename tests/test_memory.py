"""edgellm.memory: what is available (MemAvailable capped by cgroup v1/v2 limits), the refusal of a model
or KV cache that does not fit (with the numbers, before anything is loaded), and --mlock."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgellm import memory

MIB = 1 << 20


def _proc(tmp_path: Path, mem_available_kb: int, cgroup: str) -> Path:
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "meminfo").write_text(
        f"MemTotal:       24000000 kB\nMemFree:         1000000 kB\nMemAvailable:   {mem_available_kb} kB\n"
    )
    (proc / "self" / "cgroup").write_text(cgroup)
    return proc


def _write(d: Path, files: dict[str, str]) -> None:
    d.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (d / name).write_text(text)


def test_without_a_cgroup_limit_memavailable_is_what_is_available(tmp_path):
    proc = _proc(tmp_path, 2048 * 1024, "0::/user.slice\n")
    sysfs = tmp_path / "cg"
    _write(sysfs / "user.slice", {"memory.max": "max\n", "memory.current": "123\n", "memory.stat": ""})
    assert memory.available(proc, sysfs) == (2048 * MIB, "MemAvailable in /proc/meminfo")


def test_a_cgroup_v2_limit_above_the_process_caps_it_less_usage_beyond_inactive_cache(tmp_path):
    # systemd's MemoryMax=300M on the service; the service's own cgroup has no limit of its own
    proc = _proc(tmp_path, 8192 * 1024, "0::/system.slice/edgellm.service\n")
    sysfs = tmp_path / "cg"
    _write(sysfs / "system.slice", {"memory.max": "max\n", "memory.current": "0\n", "memory.stat": ""})
    _write(
        sysfs / "system.slice" / "edgellm.service",
        {"memory.max": f"{300 * MIB}\n", "memory.current": f"{120 * MIB}\n",
         "memory.stat": f"inactive_file {20 * MIB}\n"},
    )  # fmt: skip
    room, source = memory.available(proc, sysfs)
    assert room == 200 * MIB  # 300 - (120 - 20)
    assert "cgroup" in source


def test_a_cgroup_v1_memory_limit_caps_it(tmp_path):
    proc = _proc(tmp_path, 8192 * 1024, "4:memory:/docker/abc\n3:cpu:/\n")
    sysfs = tmp_path / "cg"
    _write(
        sysfs / "memory" / "docker" / "abc",
        {"memory.limit_in_bytes": f"{512 * MIB}\n", "memory.usage_in_bytes": f"{12 * MIB}\n",
         "memory.stat": f"total_inactive_file {2 * MIB}\n"},
    )  # fmt: skip
    unlimited = {"memory.limit_in_bytes": "9223372036854771712\n", "memory.usage_in_bytes": "1\n"}
    _write(sysfs / "memory", unlimited)
    assert memory.available(proc, sysfs)[0] == 502 * MIB


def test_no_meminfo_means_it_cannot_tell_and_nothing_is_refused(tmp_path, monkeypatch):
    assert memory.available(tmp_path / "nothing", tmp_path) is None
    monkeypatch.setattr(memory, "available", lambda: None)
    memory.require("m.gguf", {"weights": 1 << 50}, "hint")


def test_a_model_that_does_not_fit_is_refused_before_loading_with_the_numbers(smollm2_path, monkeypatch):
    import edgellm
    from edgellm import llm as llm_mod

    monkeypatch.setattr(memory, "available", lambda: (50 * MIB, "MemAvailable in /proc/meminfo"))
    monkeypatch.setattr(llm_mod, "ModelFile", None)  # loading would fail loudly: the check comes first
    with pytest.raises(memory.NotEnoughMemory) as e:
        edgellm.LLM(smollm2_path)
    msg = str(e.value)
    assert "SmolLM2-135M-Instruct.Q4_1.gguf needs 0.09 GiB of memory (weights 0.09 GiB)" in msg
    assert "but 0.05 GiB is available (MemAvailable in /proc/meminfo)" in msg
    assert "smaller model" in msg and memory.NO_CHECK_ENV in msg


def test_a_kv_cache_that_does_not_fit_is_refused_when_the_engine_opens(smollm2_path, monkeypatch):
    import edgellm

    llm = edgellm.LLM(smollm2_path, n_ctx=256)
    monkeypatch.setattr(memory, "available", lambda: (300 * MIB, "MemAvailable in /proc/meminfo"))
    with pytest.raises(memory.NotEnoughMemory, match=r"KV cache 1\.0\d GiB.*--kv-budget"):
        llm.open_engine(kv_tokens=50_000)  # 23,040 bytes per position on SmolLM2
    llm.open_engine(kv_tokens=2048)  # 47 MB fits
    monkeypatch.setenv(memory.NO_CHECK_ENV, "1")
    llm.open_engine(kv_tokens=50_000)  # the pages are only taken as positions are written


def test_the_cli_says_it_in_one_line(smollm2_path, monkeypatch, capsys):
    from edgellm.cli import main

    monkeypatch.setattr(memory, "available", lambda: (MIB, "MemAvailable in /proc/meminfo"))
    assert main(["run", str(smollm2_path), "-p", "hi", "-n", "1"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: SmolLM2-135M-Instruct.Q4_1.gguf needs "), err


def _locked_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmLck:"):
            return int(line.split()[1])
    pytest.skip("no VmLck in /proc/self/status")


def test_mlock_locks_the_models_mapping(smollm2_path):
    from edgellm.gguf import ModelFile

    f = ModelFile(smollm2_path)
    before = _locked_kb()
    warning = memory.lock([f.buffer[: 64 * 4096]])  # a slice: within the default 8 MiB RLIMIT_MEMLOCK
    assert warning is None
    assert _locked_kb() - before >= 256


def test_mlock_beyond_the_limit_warns_as_llama_cpp_does(monkeypatch):
    import ctypes

    class FailingLibc:
        def __init__(self):
            self.mlock = lambda addr, n: -1

    monkeypatch.setattr(ctypes, "CDLL", lambda *a, **k: FailingLibc())
    monkeypatch.setattr(ctypes, "get_errno", lambda: 12)
    warning = memory.lock([bytearray(4096)])
    assert warning.startswith("failed to mlock 4096-byte buffer (after previously locking 0 bytes): ")
    assert "RLIMIT_MEMLOCK" in warning


def _anonymous_kb() -> int:
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
        if line.startswith("Anonymous:"):
            return int(line.split()[1])
    pytest.skip("no Anonymous in /proc/self/smaps_rollup")


@pytest.mark.skipif(not Path("/proc/self/smaps_rollup").exists(), reason="Linux's smaps_rollup")
def test_a_large_kv_cache_takes_memory_only_as_positions_are_written(smollm2_path):
    import edgellm

    llm = edgellm.LLM(smollm2_path, n_ctx=256)
    llm.generate("Hi", max_tokens=2)  # the compute buffers and plans of a first call, out of the figure
    before = _anonymous_kb()
    llm.open_engine(kv_tokens=50_000)  # 1.15 GB of K and V on paper (23,040 bytes per position)
    llm.generate("Hi", max_tokens=2)
    grown_mb = (_anonymous_kb() - before) / 1024
    # zeros_like wrote every zero of V (609 MB measured); now only written pages count: with transparent
    # huge pages, one 2 MiB page per layer for K and one for V (30 layers: 120 MiB), else 4 KiB ones
    assert grown_mb < 30 * 2 * 2 + 30, f"{grown_mb:.0f} MB for a few positions"
