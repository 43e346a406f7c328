#!/usr/bin/env bash
# GPU check of the trainer and friends, one script, under 8 minutes on one GPU.
#
#   bash bench/gpu_check.sh [MODEL]      (MODEL defaults to the shipped tiny model)
#
# 1. NVML fingerprint of GPU 0 (grpo-stream fingerprint --json)
# 2. trainer steps on the GPU, fp32 vs bf16-mixed: loss agreement, tokens/s, peak memory, MFU
# 3. the hf generator on the GPU
# 4. a short `grpo-stream up` on the one GPU (trainer and generator share it)
# 5. weights published from the GPU (device -> pinned host staging), GiB/s
# Prints a summary table; with $OUT set, writes $OUT/gpu_check.json and the logs there.
#
# Hosts without pyzmq/structlog/pydantic/math-verify: put their wheels in .whl/ (see the
# README's "Training on GPUs"); they are installed into /tmp/site first.
set -uo pipefail
cd "$(dirname "$0")/.."
MODEL="${1:-grpo-stream/tiny-arith}"
OUT_DIR="${OUT:-$(mktemp -d)}"
mkdir -p "$OUT_DIR"
export PYTHONUNBUFFERED=1

if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || { echo "wheel install failed"; exit 1; }
  export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
else
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
PY=python3

step() {  # step NAME SECONDS CMD...: run with a time limit, keep its JSON line and its log
  local name=$1 limit=$2
  shift 2
  echo "== $name" >&2
  timeout "$limit" "$@" >"$OUT_DIR/$name.log" 2>&1
  local rc=$?
  grep '^{' "$OUT_DIR/$name.log" | tail -1 >"$OUT_DIR/$name.json" || true
  [ -s "$OUT_DIR/$name.json" ] || echo "{\"$name\": {\"failed\": $rc}}" >"$OUT_DIR/$name.json"
  echo "   rc=$rc" >&2
}

step fingerprint 60 $PY -m grpo_stream.cli.main fingerprint --json
step trainer 180 $PY -m bench.gpu_check trainer --model "$MODEL" --device cuda
step generate 60 $PY -m bench.gpu_check generate --model "$MODEL" --device cuda
step publish 60 $PY -m bench.gpu_check publish --model "$MODEL" --device cuda
RUN_DIR="$OUT_DIR/up-run"
step up 150 $PY -m grpo_stream.cli.main up --run-dir "$RUN_DIR" --max-steps 30 \
  --set 'trainer.device="cuda"' --set 'model.name_or_path="'"$MODEL"'"'
# up prints no JSON: summarise its metrics (reward first/last 5 steps, staleness, waits)
$PY - "$RUN_DIR" >"$OUT_DIR/up.json" <<'EOF'
import json, sys
from pathlib import Path
rows = [json.loads(l) for l in (Path(sys.argv[1]) / "metrics.jsonl").read_text().splitlines() if l.strip()] if (Path(sys.argv[1]) / "metrics.jsonl").exists() else []
mean = lambda xs: sum(xs) / len(xs) if xs else None
r = [x["reward_mean"] for x in rows if x.get("reward_mean") is not None]
print(json.dumps({"up": {"steps": len(rows), "reward_first5": mean(r[:5]), "reward_last5": mean(r[-5:]),
  "staleness_mean": mean([x.get("staleness_mean", 0.0) for x in rows]),
  "trainer_wait_s": mean([x.get("trainer_wait_s", 0.0) for x in rows])}}))
EOF

$PY - "$OUT_DIR" <<'EOF'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
data = {}
for name in ("fingerprint", "trainer", "generate", "publish", "up"):
    try:
        data[name] = json.loads((out / f"{name}.json").read_text() or "{}")
    except (OSError, json.JSONDecodeError) as exc:
        data[name] = {"failed": str(exc)}
(out / "gpu_check.json").write_text(json.dumps(data, indent=2))
t = data["trainer"].get("trainer", {})
def row(k, v): print(f"{k:34} {v}")
print("| check | result |")
dev = data["fingerprint"].get("devices", [{}])
row("GPU", dev[0].get("name") if dev else None)
for p in ("fp32", "bf16-mixed", "bf16"):
    s = t.get(p, {})
    row(f"trainer {p} tokens/s", s.get("tokens_per_s"))
    row(f"trainer {p} peak GiB", s.get("peak_gib"))
    row(f"trainer {p} MFU", s.get("mfu"))
row("loss rel diff bf16-mixed vs fp32", t.get("first_loss_rel_diff"))
row("loss rel diff bf16 vs fp32", t.get("first_loss_rel_diff_bf16"))
row("hf generate", data["generate"].get("generate"))
row("publish GiB/s", data["publish"].get("publish", {}).get("gib_per_s"))
row("publish staged (pinned buffer)", data["publish"].get("publish", {}).get("staged"))
row("up", data["up"].get("up"))
EOF
