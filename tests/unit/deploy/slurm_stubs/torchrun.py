"""Stand-in for `torchrun`: records its argv, node and GPUs, then execs the program."""

import json
import os
import sys

args = sys.argv[1:]
program = args[args.index("--no-python") + 1 :]
line = {
    "event": "torchrun",
    "service": "torchrun",
    "argv": args,
    "node": os.environ.get("SLURMD_NODENAME"),
    "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"),
}
with open(os.environ["STUB_RECORD"], "a") as f:
    f.write(json.dumps(line) + "\n")
os.execvp(program[0], program)
