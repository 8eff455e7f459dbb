# expect.sh: sourced by e2e tests (tests/e2e/*.sh) that check exit codes and messages.
#   fail MESSAGE...                  print FAIL: MESSAGE on stderr and exit 1
#   expect CODE PATTERN -- CMD...    run CMD (stdout to out.txt, stderr to err.txt); it must
#                                    exit CODE and print a stderr line matching PATTERN (grep -E)
# The one thing to know: a sourced fragment, not a test; it sets no shell options.
fail() { echo "FAIL: $*" >&2; exit 1; }
expect() {
  local code=$1 pat=$2; shift 3
  set +e; "$@" > out.txt 2> err.txt; local rc=$?; set -e
  [ "$rc" -eq "$code" ] || fail "$*: exit $rc, want $code; stderr: $(cat err.txt)"
  grep -Eq -- "$pat" err.txt || fail "$*: stderr lacks '$pat': $(cat err.txt)"
}
