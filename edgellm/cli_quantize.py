"""`edgellm quantize IN OUT TYPE`: llama-quantize's command line, writing llama-quantize's bytes."""

from __future__ import annotations

import sys
from contextlib import contextmanager
from pathlib import Path

import typer

from edgellm import quant_rules as rules

TYPE_HELP = f"File type, as llama-quantize names it: {', '.join(rules.FILE_TYPES)}."
TENSOR_TYPE_HELP = f"one of {', '.join(rules.TENSOR_TYPES)}"


def _tensor_type(value: str | None, flag: str):
    if value is None:
        return None
    t = rules.TENSOR_TYPES.get(value.upper())
    if t is None:
        raise typer.BadParameter(f"unknown tensor type {value!r}; {TENSOR_TYPE_HELP}", param_hint=flag)
    return t


def quantize(
    model_in: str = typer.Argument(..., metavar="IN", help="Model to quantize: a .gguf path or an alias."),
    model_out: Path = typer.Argument(..., metavar="OUT", help="Where to write the quantized .gguf."),
    file_type: str = typer.Argument(..., metavar="TYPE", help=TYPE_HELP),
    nthreads: int | None = typer.Argument(
        None, metavar="[NTHREADS]", help="Threads (llama-quantize's spelling)."
    ),
    threads: int | None = typer.Option(None, "-t", "--threads", help="Threads (default: every core)."),
    allow_requantize: bool = typer.Option(
        False, "--allow-requantize", help="Allow requantizing tensors that are already quantized."
    ),
    imatrix: Path | None = typer.Option(
        None, "--imatrix", help="Importance matrix (llama-imatrix's .gguf or .dat)."
    ),
    output_tensor_type: str | None = typer.Option(
        None, "--output-tensor-type", help=f"output.weight's type: {TENSOR_TYPE_HELP}."
    ),
    token_embedding_type: str | None = typer.Option(
        None, "--token-embedding-type", help=f"token_embd.weight's type: {TENSOR_TYPE_HELP}."
    ),
    leave_output_tensor: bool = typer.Option(
        False, "--leave-output-tensor", help="Leave output.weight as it is."
    ),
    pure: bool = typer.Option(
        False, "--pure", help="Every tensor in TYPE: no mixture (shape fallbacks still apply)."
    ),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="Print each tensor's new type and the sizes; write nothing."
    ),
) -> None:
    """Quantize a GGUF model to another file type, byte for byte as llama.cpp's llama-quantize does."""
    from edgellm import store
    from edgellm.cli import _log
    from edgellm.gguf import ModelFile
    from edgellm.quantize import make_plan, quantize_model

    if nthreads is not None and threads is not None and nthreads != threads:
        raise typer.BadParameter(f"two thread counts given ({nthreads} and -t {threads}); give one")
    n_threads = threads if threads is not None else nthreads
    if n_threads is not None and n_threads < 1:
        raise typer.BadParameter("threads must be at least 1", param_hint="-t")
    opts = rules.Options(
        output_tensor_type=_tensor_type(output_tensor_type, "--output-tensor-type"),
        token_embedding_type=_tensor_type(token_embedding_type, "--token-embedding-type"),
        pure=pure,
        quantize_output_tensor=not leave_output_tensor,
    )
    src = store.resolve(model_in, auto_pull=True, log=_log)
    weights = None
    if imatrix is not None:
        from edgellm.imatrix import load_imatrix

        weights = load_imatrix(imatrix)
        n_chunks = f"{weights.chunks} chunks" if weights.chunks else "chunks not recorded"
        datasets = ", ".join(weights.datasets) or "-"
        _log(f"imatrix {imatrix}: {len(weights.entries)} entries, {n_chunks}, datasets {datasets}")
    if dry_run:
        with ModelFile(src) as m:
            entries = weights.entries if weights is not None else None
            plan = make_plan(m, file_type, allow_requantize=True, options=opts, imatrix=entries)
            for p in plan.tensors:
                t = p.tensor
                shape = "x".join(str(d) for d in t.ne)
                size = f"{p.nbytes / 2**20:9.2f} MiB"
                print(f"{t.name:<36} [{shape:>16}] {t.type.name:>6} -> {p.new_type.name:<6} {size}")
        _summary(plan, None)
        return
    with _progress_bar() as progress:
        report = quantize_model(
            src,
            model_out,
            file_type,
            allow_requantize=allow_requantize,
            options=opts,
            imatrix=weights,
            imatrix_name=None if imatrix is None else str(imatrix),
            threads=n_threads,
            progress=progress,
        )
    _summary(report.plan, report.seconds)
    print(f"wrote {report.path}")


def _summary(plan, seconds: float | None) -> None:
    bpw = lambda n: n * 8 / plan.n_elements  # noqa: E731
    line = (
        f"model size = {plan.size_in / 2**20:.2f} MiB ({bpw(plan.size_in):.2f} BPW), "
        f"quant size = {plan.size_out / 2**20:.2f} MiB ({bpw(plan.size_out):.2f} BPW)"
    )
    if plan.fallbacks:
        line += f"; {len(plan.fallbacks)} of {len(plan.tensors)} tensors fell back (row length)"
    if seconds is not None:
        line += f"; {seconds:.1f} s"
    print(line, file=sys.stderr)


@contextmanager
def _progress_bar():
    """A progress bar with an ETA on stderr when it is a terminal; else a line per tenth of the work."""
    if not sys.stderr.isatty():
        last = [-1]

        def log(name: str, done: int, total: int) -> None:
            tenth = done * 10 // max(1, total)
            if tenth != last[0]:
                last[0] = tenth
                print(f"quantize: {tenth * 10}% ({name})", file=sys.stderr, flush=True)

        yield log
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        Progress,
        TaskProgressColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    columns = (
        TextColumn("{task.description:<32}"),
        BarColumn(),
        TaskProgressColumn(),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
    )
    with Progress(*columns, transient=True, console=Console(stderr=True)) as bar:
        task = bar.add_task("quantize", total=None)

        def update(name: str, done: int, total: int) -> None:
            bar.update(task, completed=done, total=total, description=name)

        yield update
