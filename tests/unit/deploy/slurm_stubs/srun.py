"""Stand-in for Slurm's `srun`: runs each task of a step as a local process.

Each task gets Slurm's task variables (SLURMD_NODENAME, SLURM_LOCALID, SLURM_PROCID) and
srun's environment; its output goes to srun's (or to its own --output file); SIGTERM is
forwarded to every task; the exit status is the worst task's.
"""

import os
import signal
import subprocess
import sys

KNOWN = {
    "overlap",
    "kill-on-bad-exit",
    "nodes",
    "ntasks",
    "ntasks-per-node",
    "nodelist",
    "output",
    "cpus-per-task",
    "label",
}
procs: list[subprocess.Popen[bytes]] = []


def forward(signum: int, frame: object) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signum)


signal.signal(signal.SIGTERM, forward)
args, opts = sys.argv[1:], {}
while args and args[0].startswith("--"):
    key, _, value = args.pop(0)[2:].partition("=")
    if key not in KNOWN:
        sys.exit(f"srun stand-in: unsupported option --{key}")
    opts[key] = value
nodes = opts["nodelist"].split(",")
per_node = int(opts["ntasks-per-node"])
if int(opts["nodes"]) != len(nodes) or int(opts["ntasks"]) != per_node * len(nodes):
    sys.exit(f"srun stand-in: inconsistent step {opts}")
if "overlap" not in opts:
    sys.exit("srun stand-in: concurrent steps need --overlap")
for n, node in enumerate(nodes):
    for local in range(per_node):
        rank = n * per_node + local
        env = dict(
            os.environ, SLURMD_NODENAME=node, SLURM_LOCALID=str(local), SLURM_PROCID=str(rank)
        )
        if "output" not in opts:
            procs.append(subprocess.Popen(args, env=env))
            continue
        out = opts["output"].replace("%N", node).replace("%t", str(rank))
        with open(out, "w") as log:
            procs.append(subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT))
sys.exit(max(p.wait() for p in procs))
