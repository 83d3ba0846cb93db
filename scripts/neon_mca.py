"""Static estimate of the NEON kernels' speed on an Arm core model, for machines without one.

Compiles native/kernels/neon.c for aarch64 (aarch64-linux-gnu-gcc, the flags of the extension build), takes
each kernel's innermost loops from the disassembly and runs them through LLVM's machine code analyzer
(llvm-mca, Debian's `llvm`) on a core model (Neoverse N1 by default: the Cortex-A76 of a Raspberry Pi 5;
LLVM 14 schedules neoverse-n1 with its Cortex-A57 model, two 64-bit FP pipes, so read the figures as ratios).
Reports cycles per 16-byte integer dot (one sdot, or without the dot-product extension one sadalp) in the
steady state of the loop that does the most dots per iteration: vec_dot (one weight row, one activation
row) against vec_dot_nx (the same weight row against 4 activation rows, each weight block unpacked once).

This is a model, not a measurement: it ignores caches and memory (decode on a Pi is bound by memory) and
the model's pipeline details are LLVM's. Usage:

    python scripts/neon_mca.py [--cpu neoverse-n1|cortex-a72|cortex-a55] [--march armv8.2-a+dotprod|armv8-a]
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TYPES = ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "iq4_nl", "q2_K", "q3_K", "q4_K", "q5_K", "q6_K")
BRANCH = re.compile(r"^(b\.\w+|b|cbz|cbnz|tbz|tbnz)$")


def functions(obj: Path) -> dict[str, list[tuple[int, str, str]]]:
    """name -> [(address, mnemonic, operands)] from objdump."""
    cmd = ["aarch64-linux-gnu-objdump", "-d", "--no-show-raw-insn", str(obj)]
    dis = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    out: dict[str, list[tuple[int, str, str]]] = {}
    for block in re.split(r"\n(?=[0-9a-f]+ <)", dis):
        m = re.match(r"[0-9a-f]+ <([^>]+)>:", block)
        if not m:
            continue
        ins = []
        for line in block.split("\n")[1:]:
            mm = re.match(r"\s*([0-9a-f]+):\s+(\S+)\s*(.*)", line)
            if mm:
                ins.append((int(mm.group(1), 16), mm.group(2), mm.group(3).split("//")[0].strip()))
        out[m.group(1)] = ins
    return out


def innermost_loops(ins: list[tuple[int, str, str]]) -> list[list[str]]:
    """Each backward branch's span, keeping those with no other loop inside, as assembly lines."""
    index = {a: i for i, (a, _, _) in enumerate(ins)}
    spans = []
    for i, (_, op, args) in enumerate(ins):
        t = re.search(r"([0-9a-f]+) <", args)
        if BRANCH.match(op) and t and int(t.group(1), 16) in index and index[int(t.group(1), 16)] < i:
            spans.append((index[int(t.group(1), 16)], i))
    inner = [s for s in spans if not any(o != s and s[0] <= o[0] and o[1] <= s[1] for o in spans)]
    return [
        ["L0:"] + [f"{op} {re.sub(r'[0-9a-f]+ <[^>]*>', 'L0', args)}" for _, op, args in ins[s : e + 1]]
        for s, e in inner
    ]


def cycles_per_dot(lines: list[str], cpu: str, iterations: int = 200) -> tuple[int, float] | None:
    dots = sum(1 for x in lines if x.startswith(("sdot", "sadalp")))
    if not dots:
        return None
    res = subprocess.run(
        ["llvm-mca", f"-mcpu={cpu}", "-mtriple=aarch64", f"-iterations={iterations}"],
        input="\n".join(lines) + "\n",
        capture_output=True,
        text=True,
    )
    m = re.search(r"Total Cycles:\s+(\d+)", res.stdout)
    return (dots, int(m.group(1)) / iterations / dots) if m else None


def loops(funcs: dict, name: str, cpu: str) -> list[tuple[int, float]]:
    """(dots per iteration, cycles per dot) of the function's innermost loops, most dots first."""
    found = [r for loop in innermost_loops(funcs.get(name, [])) if (r := cycles_per_dot(loop, cpu))]
    return sorted(found, reverse=True)


def best(funcs: dict, name: str, cpu: str) -> float | None:
    """Cycles per dot of the function's loop with the most dots per iteration."""
    found = loops(funcs, name, cpu)
    return found[0][1] if found else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cpu", default="neoverse-n1")
    ap.add_argument("--march", default="armv8.2-a+dotprod")
    args = ap.parse_args()
    for tool in ("aarch64-linux-gnu-gcc", "aarch64-linux-gnu-objdump", "llvm-mca"):
        if shutil.which(tool) is None:
            print(f"{tool} not found (apt-get install gcc-aarch64-linux-gnu binutils-aarch64-linux-gnu llvm)")
            return 1
    sfx = "dotprod" if "dotprod" in args.march else "neon"
    with tempfile.TemporaryDirectory() as tmp:
        obj = Path(tmp) / "neon.o"
        subprocess.run(
            ["aarch64-linux-gnu-gcc", "-O3", "-std=c11", f"-march={args.march}", "-c", "-o", str(obj),
             str(ROOT / "native/kernels/neon.c")],
            check=True,
        )  # fmt: skip
        funcs = functions(obj)
    print(f"llvm-mca -mcpu={args.cpu}, -march={args.march}: cycles per 16-byte dot (lower is faster)")
    print("| type | vec_dot | vec_dot_nx, 4 rows | x16_gemm, 1 row | x16_gemm, 2 rows |")
    print("|---|---|---|---|---|")
    for t in TYPES:
        one = best(funcs, f"vec_dot_{t}_{sfx}", args.cpu)
        nx = best(funcs, f"vec_dot_{t}_nx_{sfx}", args.cpu)
        x16 = {dots: c for dots, c in loops(funcs, f"x16n_gemm_{t}", args.cpu)}  # nc = 2 does twice nc = 1's
        cells = [one, nx, x16[min(x16)] if x16 else None, x16[max(x16)] if len(x16) > 1 else None]
        text = ["-" if v is None else f"{v:.2f}" for v in cells]
        if len(x16) == 1:
            text[3] = "(1 row at a time)"  # the K-quants' x16 kernels take prompt rows one by one
        print(f"| {t} | " + " | ".join(text) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
