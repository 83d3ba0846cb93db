"""cffi (API mode) build of `edgellm._native`: the runtime (native/runtime/*.c) and the kernels
(native/kernels/*.c) in one extension, built without -march (kernels carry target attributes, so one x86
build runs on any x86-64 and picks its code path at run time).

setup.py builds it at install time through `cffi_modules`; during development rebuild it in place with
`python native/build_native.py` (writes edgellm/_native.*.so next to the package's sources).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from cffi import FFI

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CFLAGS = ["-O3", "-std=c11", "-fPIC", "-pthread"]
# Loops start on a cache line, so a kernel's speed does not hang on where the linker happens to put it:
# on the AMX Xeon, the same Q4_K / Q6_K decode code decoded Qwen2.5-Coder-1.5B at 22.9-23.2 or 25.2-25.8
# tok/s as unrelated code before it moved the loops by 16 bytes; with this, 24.4-25.2 either way.
# Where the compiler does not take the flag (an old clang), it is left out.
OPTIONAL_CFLAGS = ["-falign-loops=64"]


def _compiler_takes(flag: str) -> bool:
    """Whether the C compiler setuptools will use ($CC, else sysconfig's) compiles an empty file with
    `flag`."""
    import os
    import shlex
    import subprocess
    import sysconfig
    import tempfile

    cc = shlex.split(os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc")
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "probe.c"
        src.write_text("int probe(void) { return 0; }\n")
        try:
            run = subprocess.run(
                [*cc, flag, "-Werror", "-c", str(src), "-o", str(Path(tmp) / "probe.o")], capture_output=True
            )
        except OSError:
            return False
        return run.returncode == 0


def _cdef() -> str:
    """The runtime's public header without its preprocessor lines (cffi's cdef parses declarations only)."""
    text = (HERE / "runtime" / "ed_runtime.h").read_text()
    return "\n".join(line for line in text.splitlines() if not re.match(r"\s*#", line))


def make_builder(relative: bool) -> FFI:
    """The extension's builder; `relative`: source paths relative to the project root (setuptools runs
    there and wants them so), else absolute (cffi's own compile() works in a temporary directory)."""

    def path(p: Path) -> str:
        return str(p.relative_to(ROOT)) if relative else str(p)

    ffi = FFI()
    ffi.cdef(_cdef())
    ffi.set_source(
        "edgellm._native",
        '#include "ed_runtime.h"',
        sources=[
            path(p) for p in sorted((HERE / "runtime").glob("*.c")) + sorted((HERE / "kernels").glob("*.c"))
        ],
        include_dirs=[path(HERE / "runtime"), path(HERE)],
        extra_compile_args=CFLAGS + [f for f in OPTIONAL_CFLAGS if _compiler_takes(f)],
        extra_link_args=["-pthread"],
        libraries=["m"],
    )
    return ffi


# setup.py's `cffi_modules = ["native/build_native.py:ffibuilder"]`: pip runs setup.py in the project root
ffibuilder = make_builder(relative=Path.cwd() == ROOT)


def build_in_place(verbose: bool = True) -> Path:
    """Compile into build/native and put the extension inside the source tree's edgellm/ package."""
    import shutil
    import sysconfig

    tmp = ROOT / "build" / "native"
    tmp.mkdir(parents=True, exist_ok=True)
    built = Path(make_builder(relative=False).compile(tmpdir=str(tmp), verbose=verbose))
    for old in (ROOT / "edgellm").glob("_native*.so"):  # e.g. pip install -e's abi3 build: one copy only
        old.unlink()
    target = ROOT / "edgellm" / ("_native" + sysconfig.get_config_var("EXT_SUFFIX"))
    shutil.copyfile(built, target)
    return target


if __name__ == "__main__":
    print(build_in_place(verbose="-q" not in sys.argv[1:]))
