# The Ceph RGW lane, sourced by scripts/test: the agent against Ceph RGW
# 16.2 on a throwaway one-host cluster (scripts/ceph). Runs the
# store-generic operation bodies of tests/tests/operations.rs (`rgw::*`),
# tests/tests/ceph_rgw.rs and tests/tests/ceph_failover.rs (feature `ceph`
# of sluice-tests), one cluster per test binary, under one time budget. Needs the workspace binaries built and
# SLUICE_TEST_PYTHON (boto3); installs Ceph (root or password-less sudo).
# Every line goes to stdout; a binary that ended before its libtest summary
# (the budget ran out, a crash) adds "test result: FAILED. 0 passed; 1
# failed" so the suite's totals count it.

# ceph_lane [BUDGET_S]: exit status 0 when every test passed.
ceph_lane() {
  local budget="${1:-600}" t0 status=0 left rc out run features
  t0=$(date +%s)
  # The whole workspace is selected, with the features of the suite's build
  # (SLUICE_WORKSPACE_FEATURES, set by scripts/test), so only sluice-tests
  # compiles again: cargo resolves features per invocation, and
  # `-p sluice-tests` alone compiled some forty crates again.
  features="sluice-tests/ceph${SLUICE_WORKSPACE_FEATURES:+,$SLUICE_WORKSPACE_FEATURES}"
  if ! scripts/ceph install; then
    echo "ceph-lane: FAILED: could not install Ceph (scripts/ceph install)"
    echo "test result: FAILED. 0 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out"
    return 1
  fi
  if ! cargo test --workspace --features "$features" --test operations --test ceph_rgw --test ceph_failover --no-run --locked --quiet; then
    echo "ceph-lane: FAILED: the test binaries did not build"
    echo "test result: FAILED. 0 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out"
    return 1
  fi
  # Each test binary starts (and, once it exits, stops) its own cluster.
  for run in "operations rgw::" "ceph_rgw" "ceph_failover"; do
    left=$((budget - ($(date +%s) - t0)))
    out=$(mktemp)
    # shellcheck disable=SC2086 # "binary [filter]"
    set -- $run
    timeout --kill-after=10 "$((left > 1 ? left : 1))" \
      cargo test --workspace --features "$features" --locked --test "$1" -- ${2:+"$2"} 2>&1 | tee "$out"
    rc=${PIPESTATUS[0]}
    if [ "$rc" -ne 0 ]; then
      status=$rc
      if ! grep -q '^test result:' "$out"; then
        [ "$rc" -eq 124 ] && echo "ceph-lane: FAILED: $1 ran past the lane's ${budget} s budget"
        echo "test result: FAILED. 0 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out"
      fi
    fi
    rm -f "$out"
  done
  echo "ceph-lane: exit $status in $(($(date +%s) - t0)) s (budget ${budget} s)"
  return "$status"
}
