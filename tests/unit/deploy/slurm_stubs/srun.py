"""Stand-in for Slurm's `srun` as `up --launcher slurm` calls it: one task on one node
(`srun --nodes=1 --ntasks=1 -w NODE --overlap COMMAND...`), run on this machine.

The task gets Slurm's task variables (SLURMD_NODENAME, SLURM_LOCALID, SLURM_PROCID) and
srun's environment, stdin and output, and receives the signals srun receives: it replaces
this process, as srun's one task stands for it.
"""

import os
import sys

args = sys.argv[1:]
opts: dict[str, str] = {}
while args and args[0].startswith("-"):
    flag = args.pop(0)
    if flag == "-w":
        opts["nodelist"] = args.pop(0)
        continue
    key, _, value = flag[2:].partition("=")
    if key not in ("nodes", "ntasks", "overlap"):
        sys.exit(f"srun stand-in: unsupported option {flag}")
    opts[key] = value
if (opts.get("nodes"), opts.get("ntasks")) != ("1", "1") or "overlap" not in opts:
    sys.exit(f"srun stand-in: expected one task on one node with --overlap, got {opts}")
env = dict(os.environ, SLURMD_NODENAME=opts["nodelist"], SLURM_LOCALID="0", SLURM_PROCID="0")
os.execvpe(args[0], args, env)
