"""Time to first token of a long prompt read back from a slot file against computing it (llama-server's
--slot-save-path): one server reads a long document (a slot's conversation) and saves the slot; a fresh
server then answers a question about the document cold, and (after a restart) again once the slot file
is restored. Rounds alternate, each on fresh servers.

    python scripts/bench_slot_restore.py qwen2.5-coder-0.5b --tokens 2000 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, model: str, saves: Path, threads: int, n_ctx: int):
        self.port = _port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "edgellm", "serve", model, "--port", str(self.port), "-t", str(threads),
               "-c", str(n_ctx), "--parallel", "1", "--slot-save-path", str(saves)]  # fmt: skip
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        end = time.monotonic() + 300
        while time.monotonic() < end:
            try:
                urllib.request.urlopen(self.url + "/health", timeout=2)
                return
            except OSError:
                time.sleep(0.1)
        raise SystemExit("the server did not start")

    def post(self, path: str, body: dict) -> dict:
        req = urllib.request.Request(
            self.url + path, json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=600) as r:
            return json.load(r)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(60)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--tokens", type=int, default=2000, help="about so many tokens of document")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    doc = readme[: args.tokens * 4]  # ~4 characters a token in English text
    question = "\n\nQuestion: which command runs the tests?\nAnswer:"
    cold, warm, restore_ms, file_mb = [], [], [], []
    with tempfile.TemporaryDirectory() as saves:
        s = Server(args.model, Path(saves), args.threads, args.tokens * 2 + 512)
        read = s.post("/completion", {"prompt": doc, "n_predict": 0, "id_slot": 0})
        saved = s.post("/slots/0?action=save", {"filename": "doc.bin"})
        s.stop()
        n_doc = read["tokens_evaluated"]
        file_mb.append(saved["n_written"] / 2**20)
        for _ in range(args.rounds):
            for restored in (False, True):
                s = Server(args.model, Path(saves), args.threads, args.tokens * 2 + 512)
                try:
                    if restored:
                        restore_ms.append(
                            s.post("/slots/0?action=restore", {"filename": "doc.bin"})["timings"][
                                "restore_ms"
                            ]
                        )
                    t = time.perf_counter()
                    r = s.post("/completion", {"prompt": doc + question, "n_predict": 1, "temperature": 0})
                    (warm if restored else cold).append((time.perf_counter() - t, r["tokens_cached"]))
                finally:
                    s.stop()
    print(f"{args.model}: a {n_doc}-token document, slot file {file_mb[0]:.1f} MiB, {args.threads} threads")
    print(f"  cold:     first token {statistics.median(x for x, _ in cold):.2f} s (cached {cold[0][1]})")
    print(f"  restored: first token {statistics.median(x for x, _ in warm):.2f} s (cached {warm[0][1]}),"
          f" restore {statistics.median(restore_ms):.0f} ms")  # fmt: skip


if __name__ == "__main__":
    main()
