"""The harness of the Slurm tests: what `up --launcher slurm` would start, read from its dry
run (instance, host, device environment, command line), whether `up` runs in-process or is
what deploy/slurm/grpo-stream.sbatch execs; and a stand-in `srun` for the run that starts
real services without a Slurm controller.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

STUBS = Path(__file__).parent / "slurm_stubs"
GRPO_STREAM = Path(sys.executable).parent / "grpo-stream"
MODULE = ["-m", "grpo_stream.cli.main"]


@dataclass(frozen=True)
class Planned:
    """One service in `up --dry-run`'s output."""

    instance: str
    host: str
    env: str
    """The device environment, as the dry run prints it ("-": none)."""
    cmd: list[str]
    """The whole command line: srun, its options, then what runs on the node."""

    @property
    def srun(self) -> list[str]:
        """srun and its options, up to the program it starts."""
        return self.cmd[: self.cmd.index("--overlap") + 1]

    @property
    def devices(self) -> str | None:
        """CUDA_VISIBLE_DEVICES as the task sees it (set after srun; None: not set)."""
        words = self.cmd[len(self.srun) :]
        if words[0] != "env":
            return None
        found = [w.split("=", 1)[1] for w in words if w.startswith("CUDA_VISIBLE_DEVICES=")]
        return found[0] if found else None

    @property
    def service(self) -> list[str]:
        """The `grpo-stream ...` command the node finally runs (after the receiving end,
        torchrun and the rendezvous wait), with `grpo-stream` for `python -m ...main`."""
        words = self.cmd[self.cmd.index("--") + 1 :]
        start = next(i for i in range(len(words)) if words[i : i + 2] == MODULE)
        return ["grpo-stream", *words[start + 2 :]]

    @property
    def torchrun(self) -> list[str] | None:
        """torchrun's own arguments on a trainer node (None: no torchrun)."""
        words = self.cmd
        at = next((i for i, w in enumerate(words) if w == "torch.distributed.run"), None)
        return None if at is None else words[at + 1 :]


def read_dry_run(output: str) -> dict[str, Planned]:
    """Each service block of a dry run, by instance."""
    lines = output.splitlines()
    out = {}
    for i, line in enumerate(lines):
        if " host=" not in line:
            continue
        instance, host = line.split()[0], line.split("host=", 1)[1].split()[0]
        env = lines[i + 1].strip().removeprefix("env: ")
        cmd = shlex.split(lines[i + 2].strip().removeprefix("cmd: "))
        out[instance] = Planned(instance, host, env, cmd)
    return out


def job_env(nodes: str, **params: str) -> dict[str, str]:
    """The environment of a batch script on `nodes` (no other Slurm variable leaks in)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "CONFIG"))}
    for name in ("TRAINER_NODES", "TRAINER_GPUS", "GENERATORS_PER_NODE", "SCORERS", "KEYS_DIR"):
        base.pop(name, None)
    return {**base, "SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": nodes, **params}


def run_script(
    script: Path, cwd: Path, env: dict[str, str], *args: str, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """The batch script under bash as sbatch would run it, the real `grpo-stream` on PATH."""
    env = {"GRPO_STREAM": str(GRPO_STREAM), **env}
    return subprocess.run(
        ["bash", str(script), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def srun_stand_in(root: Path) -> Path:
    """A directory holding `srun`, the stand-in that runs a step's one task on this machine
    (slurm_stubs/srun.py), run by this interpreter."""
    bin_dir = root / "bin"
    bin_dir.mkdir()
    srun = bin_dir / "srun"
    srun.write_text(f"#!{sys.executable} -S\n{(STUBS / 'srun.py').read_text()}")
    srun.chmod(0o755)
    return bin_dir
