#!/bin/bash
# p14: the decisive K=4, lr 2.5e-5, 120-step experiment, one bench process at a time.
cd /work/wt/p14 && . .venv/bin/activate
C="--lr 2.5e-5 --minibatches 4 --steps 120 --seeds 0,1,2,3"
uptime > /tmp/p14logs/main.uptime
python -m bench.off_policy $C --staleness 0,4 --s0-modes tis --modes behaviour,tis \
    --name p14_k4_120_main > /tmp/p14logs/main.log 2>&1
uptime >> /tmp/p14logs/main.uptime
run_new() {
  while [ ! -f /tmp/p14logs/new_ready ]; do sleep 15; done
  M=$(cat /tmp/p14logs/new_ready)
  uptime > /tmp/p14logs/new.uptime
  python -m bench.off_policy $C --staleness 4 --modes $M --name p14_k4_120_new > /tmp/p14logs/new.log 2>&1
  uptime >> /tmp/p14logs/new.uptime
}
run_dec() {
  uptime > /tmp/p14logs/dec.uptime
  python -m bench.off_policy $C --staleness 4 --modes decoupled --name p14_k4_120_dec > /tmp/p14logs/dec.log 2>&1
  uptime >> /tmp/p14logs/dec.uptime
}
if [ -f /tmp/p14logs/new_ready ]; then run_new; run_dec; else run_dec; run_new; fi
echo done > /tmp/p14logs/chain.done
