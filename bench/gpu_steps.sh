# Sourced by bench/gpu_check.sh and bench/gpu_scale.sh: the work folder, the time budget, the
# bundle's install and one function per step. Before sourcing, set PY, BUNDLE, BUDGET and
# WORK; `step NAME SECONDS CMD...` runs CMD (STEP=NAME and LIMIT=its seconds in its
# environment) with its output in WORK/NAME.log, its time cut to what is left of BUDGET (the
# summary always comes), and appends "NAME RC" to WORK/rc.txt; ONLY (",a,b,") limits the
# steps that run; STEP_SCALE (default 1) multiplies every step's limit (a CPU rehearsal's
# steps run on two shared cores, not on a GPU).
SITE="$WORK/site"
mkdir -p "$WORK"
: >"$WORK/rc.txt"
cd "$WORK" || exit 2
export PYTHONUNBUFFERED=1 PYTHONPATH="$SITE"

step() { # step NAME SECONDS CMD...: run CMD under the time limit; its rc goes to rc.txt
  local name=$1 limit=$(($2 * ${STEP_SCALE:-1}))
  shift 2
  [ -z "${ONLY:-}" ] || [[ "$ONLY" == *",$name,"* ]] || return 0
  local left=$((BUDGET - SECONDS - 15))
  [ "$left" -lt "$limit" ] && limit=$left
  if [ "$limit" -lt 10 ]; then
    echo "no time left of the budget ($BUDGET s)" >"$WORK/$name.log"
    echo "$name 124" >>"$WORK/rc.txt"
    return 0
  fi
  echo "== $name (limit ${limit} s)" >&2
  local t0=$SECONDS
  STEP=$name LIMIT=$limit timeout --kill-after=10 "$limit" "$@" >"$WORK/$name.log" 2>&1
  local rc=$?
  echo "   rc=$rc after $((SECONDS - t0)) s" >&2
  echo "$name $rc" >>"$WORK/rc.txt"
}

install_bundle() { # the bundle's wheels into WORK/site (the steps import only from there)
  if [ -f "$BUNDLE/bundle.json" ]; then
    step install 90 "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
      --disable-pip-version-check --upgrade --target "$SITE" "$BUNDLE"/*.whl
  else
    echo "no bundle at $BUNDLE (bundle.json): build it with python scripts/gpu_bundle.py" \
      | tee "$WORK/install.log" >&2
    echo "install 1" >>"$WORK/rc.txt"
  fi
}

write_logs() { # every step's log tail into one file
  while read -r name rc; do
    echo "== $name rc=$rc"
    tail -n 60 "$WORK/$name.log"
  done <"$WORK/rc.txt" >"$1"
}
