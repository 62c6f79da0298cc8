# Shared by the test scripts (sourced, never run): the stage banner and pytest's verdict.

# stage TEXT: a banner with the wall time and the seconds since the script started.
stage() { printf '\n==== %s [%s, %ds]\n' "$*" "$(date +%T)" "$SECONDS"; }

# pytest_verdict WHO RC: turns pytest's exit status into the script's. Status 5 (no test
# collected) is a failure too: a suite that silently ran nothing must not pass.
pytest_verdict() {
  local who=$1 rc=$2
  if [ "$rc" -eq 5 ]; then
    echo "$who: pytest collected no tests: failing" >&2
    return 1
  fi
  if [ "$rc" -ne 0 ]; then
    echo "$who: pytest failed (exit $rc)" >&2
    return "$rc"
  fi
}
