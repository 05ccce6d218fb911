"""Building the stand-in NVML library (``nvml_standin.c``) and setting its figures."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

SOURCE = Path(__file__).with_name("nvml_standin.c")
LIBRARY = "libnvidia-ml.so.1"
FIGURES = "nvml-standin.txt"


@dataclass(frozen=True)
class Gpu:
    util: int
    used_mib: int
    total_mib: int = 81920
    power_mw: int = 300_000


def build(directory: Path) -> Path:
    """Compile the stand-in into ``directory``; the library's path."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    assert compiler is not None, "a C compiler is needed to build the stand-in NVML"
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / LIBRARY
    subprocess.run(
        [
            compiler,
            "-shared",
            "-fPIC",
            "-O2",
            f"-Wl,-soname,{LIBRARY}",
            "-o",
            str(target),
            str(SOURCE),
            "-ldl",
        ],
        check=True,
    )
    return target


def set_figures(library: Path, gpus: list[Gpu]) -> None:
    """What the stand-in reports from now on (replaced whole, never half-written)."""
    lines = "".join(f"{g.util} {g.used_mib} {g.total_mib} {g.power_mw}\n" for g in gpus)
    temporary = library.with_name(FIGURES + ".tmp")
    temporary.write_text(lines)
    os.replace(temporary, library.with_name(FIGURES))
