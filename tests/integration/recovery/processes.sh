# Helpers of the recovery scripts that run `deltacast run` processes (sourced):
#   wait_for SECONDS CMD...   polls CMD every 0.1 s until it succeeds; false after SECONDS
#   wait_exit PID SECONDS     the process's exit status, or 124 when it still runs after SECONDS
#   stopped PID               true when the process is stopped (SIGSTOP)
#   free_ports N              the first of N consecutive free ports on 127.0.0.1
#   cleanup                   the EXIT trap: kills and reaps every pid in PIDS (the processes the
#                             script started), removes WORK when PASSED=1, else says where it is
#   tail_logs FILE...         the last 12 lines of each FILE that exists (for a failure)
#   write_secret FILE         a fresh 32-byte hex secret in FILE, mode 600 (the config's secret_file)
wait_for() {
  local deadline=$((SECONDS + $1)); shift
  until "$@"; do
    [ "$SECONDS" -lt "$deadline" ] || return 1
    sleep 0.1
  done
}
wait_exit() {
  local pid=$1
  wait_for "$2" bash -c "! kill -0 $pid 2>/dev/null || [ \"\$(cut -d' ' -f3 /proc/$pid/stat 2>/dev/null)\" = Z ]" || return 124
  local status=0
  wait "$pid" || status=$?
  return "$status"
}
stopped() { [ "$(cut -d' ' -f3 "/proc/$1/stat" 2>/dev/null)" = T ]; }
# shellcheck source=../ports.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/ports.sh"
cleanup() {
  for pid in "${PIDS[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  if [ "${PASSED:-0}" = 1 ]; then rm -rf "$WORK"; else echo "(files kept in $WORK)" >&2; fi
}
tail_logs() {
  for f in "$@"; do
    [ -f "$f" ] || continue
    echo "--- $f (last lines):" >&2
    tail -n 12 "$f" >&2 || true
  done
}
write_secret() {
  head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$1"
  chmod 600 "$1"
}
