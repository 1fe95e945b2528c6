# Shared by the H200 scripts (sourced, not run): numbered steps with their own time limits, and the
# install of carried wheels plus the project. Expects PY; counts failed steps in $failed.
failed=0
# want NAME: whether step NAME is selected ($H200_STEPS: comma-separated names; empty: every step)
want() { [ -z "${H200_STEPS:-}" ] || [[ ",$H200_STEPS," == *",$1,"* ]]; }
step() { echo; echo "=== $1 ($(date -u +%H:%M:%S))"; }
# run LIMIT_S CMD...: a failing or timed-out step is reported and counted, and the script goes on
# (in its own process group, killed whole on time-out: pytest-xdist workers must not outlive their step and
# load the GPU and CPU under the next step's timings)
run() {
  local limit=$1; shift
  setsid timeout "$limit" "$@" & local pid=$!
  wait $pid; local rc=$?
  kill -9 -- -$pid 2>/dev/null
  [ $rc -ne 0 ] && { echo "!!! failed (exit $rc): $*"; failed=$((failed + 1)); }
  return 0
}
# the wheels carried in .whl/ (the image lacks them) into /tmp/site, then this checkout, editable
install_project() {
  if ls .whl/*.whl >/dev/null 2>&1; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
      && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  fi
  $PY -m pip install -q --no-deps --no-build-isolation -e . || { echo "install failed"; exit 99; }
}
