"""The deployment pieces a Raspberry Pi owner uses (docs/raspberry-pi.md): the systemd unit
(examples/edgellm.service), run as its ExecStart says, stays under 400 MB RSS serving SmolLM2 with default
flags and stops on SIGTERM; the desktop assistant (examples/desktop_assistant.py) streams, cancels and keeps
the conversation."""

from __future__ import annotations

import configparser
import importlib.util
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
UNIT = ROOT / "examples" / "edgellm.service"
RSS_LIMIT_KB = 400 * 1024


def _unit() -> configparser.ConfigParser:
    unit = configparser.ConfigParser(interpolation=None, strict=True)
    unit.optionxform = str  # systemd keys are case-sensitive
    unit.read_string(UNIT.read_text())
    return unit


def test_the_unit_runs_as_a_dedicated_user_capped_restarted_and_on_loopback():
    s = _unit()["Service"]
    assert s["User"] == "edgellm" and s["Group"] == "edgellm"
    assert s["Restart"] == "on-failure"
    assert s["MemoryMax"] == "1G"
    assert s["NoNewPrivileges"] == "yes"
    argv = shlex.split(s["ExecStart"])
    assert argv[:3] == ["/opt/edgellm/bin/edgellm", "serve", "smollm2-135m"]
    assert argv[argv.index("--host") + 1] == "127.0.0.1"
    env = dict(kv.split("=", 1) for kv in shlex.split(s["Environment"]))
    assert env["EDGELLM_HOME"] == "/var/lib/edgellm" == "/var/lib/" + s["StateDirectory"]
    assert _unit()["Install"]["WantedBy"] == "multi-user.target"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _get(url: str, body: dict | None = None, timeout: float = 120) -> dict:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data, {"content-type": "application/json"} if data else {})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def _peak_rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads RSS from /proc")
def test_the_units_server_stays_under_400_mb_serving_smollm2_and_stops_on_sigterm(smollm2_path, tmp_path):
    pytest.importorskip("fastapi")
    s = _unit()["Service"]
    argv = shlex.split(s["ExecStart"])
    port = _free_port()
    argv[argv.index("--port") + 1] = str(port)
    home = tmp_path / "edgellm-home"
    (home / "models").mkdir(parents=True)
    (home / "models" / smollm2_path.name).symlink_to(smollm2_path)  # the unit's cache, already pulled
    env = {**os.environ, "EDGELLM_HOME": str(home)}
    log = open(tmp_path / "serve.log", "wb")  # noqa: SIM115 - the server's, closed with it
    proc = subprocess.Popen([sys.executable, "-m", "edgellm", *argv[1:]], env=env, stdout=log, stderr=log)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if _get(base + "/health", timeout=5).get("status") == "ok":
                    break
            except OSError:
                pass
            up = proc.poll() is None and time.monotonic() < deadline
            assert up, "the server did not come up: " + (tmp_path / "serve.log").read_text()[-2000:]
            time.sleep(0.5)
        ask = {
            "messages": [{"role": "user", "content": "Tell me a long story about a dragon."}],
            "max_tokens": 96,
        }
        with ThreadPoolExecutor(4) as pool:  # the default -np 4, all busy
            answers = list(pool.map(lambda _: _get(base + "/v1/chat/completions", ask), range(4)))
        assert all(a["usage"]["completion_tokens"] > 0 for a in answers)
        peak = _peak_rss_kb(proc.pid)
        print(f"peak RSS {peak // 1024} MB")
        assert peak < RSS_LIMIT_KB, f"peak RSS {peak // 1024} MB"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=int(s["TimeoutStopSec"])) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()


def _assistant_module():
    spec = importlib.util.spec_from_file_location(
        "desktop_assistant", ROOT / "examples" / "desktop_assistant.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def assistant(smollm2_path):
    return _assistant_module().Assistant(str(smollm2_path), max_tokens=48)


def test_the_assistant_streams_and_keeps_the_conversation(assistant):
    assistant.reset()
    pieces: list[str] = []
    reply = assistant.ask("My name is Ada. What is the capital of France?", pieces.append, temperature=0)
    assert len(pieces) > 1 and "".join(pieces) == reply
    assert [m["role"] for m in assistant.messages] == ["system", "user", "assistant"]
    assistant.ask("What did I say my name was?", temperature=0)
    assert [m["role"] for m in assistant.messages] == ["system", "user", "assistant", "user", "assistant"]
    assert assistant.llm.last_timings.cached_tokens > 20  # the first turn came from the prefix cache


def test_the_assistant_cancels_from_another_thread_and_answers_the_next_question(assistant):
    assistant.reset()
    seen: list[str] = []

    def on_text(piece: str) -> None:
        seen.append(piece)
        if len(seen) == 3:  # the UI thread's Stop button, pressed while the answer streams
            stop = threading.Thread(target=assistant.cancel)
            stop.start()
            stop.join()

    reply = assistant.ask("Count from one to one hundred in words.", on_text, temperature=0)
    assert assistant.finish_reason == "cancelled"
    assert reply == "".join(seen) and len(seen) == 3
    assert assistant.messages[-1] == {"role": "assistant", "content": reply}
    again = assistant.ask("Say hello.", temperature=0)
    assert again and assistant.finish_reason in ("stop", "length")
