#!/usr/bin/env bash
# A throw-away, real S3 server on 127.0.0.1 for the object-storage tests and CI: Ceph's RADOS
# Gateway (radosgw, beast frontend) on a single-node cluster, one mon and one memstore OSD (objects
# live in the OSD's RAM and are gone after `stop`). docs/object-storage.md says why Ceph and how to
# use it.
#
#   scripts/s3-server.sh start DIR        a fresh cluster in DIR (conf, data, logs, pids, sockets),
#                                         on free ports picked now; an S3 user with a random key; a
#                                         bucket. When ready: DIR/s3.env (S3_ENDPOINT, S3_REGION,
#                                         S3_BUCKET, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, S3_DIR)
#   scripts/s3-server.sh stop DIR         stops rgw, osd, mon by PID; idempotent
#   scripts/s3-server.sh status DIR       exit 0 when radosgw answers
#   scripts/s3-server.sh smoke DIR        curl SigV4: PUT, Range GET, ListObjectsV2, 2x5 MiB
#                                         multipart, wrong secret -> 403
#   scripts/s3-server.sh kill-rgw DIR     SIGKILL radosgw only (mon and osd, so the objects, stay)
#   scripts/s3-server.sh restart-rgw DIR  (re)starts radosgw on the same port; waits until it answers
#   scripts/s3-server.sh curl DIR ARGS... curl signed with DIR's key (SigV4); PH=<sha256 of the body>
#                                         or UNSIGNED-PAYLOAD (default: the hash of an empty body)
#   scripts/s3-server.sh revoke-key DIR   deletes the S3 user's key: requests get 403
#                                         InvalidAccessKeyId (credentials revoked mid-run)
#   scripts/s3-server.sh restore-key DIR  makes that key again, the same key and secret
#   scripts/s3-server.sh admin DIR ARGS... radosgw-admin ARGS on DIR's cluster
#   scripts/s3-server.sh install          scripts/install-deps.sh --test (ceph-mon ceph-osd radosgw
#                                         uuid-runtime curl); nothing else here installs anything
#
# Use: scripts/s3-server.sh start /tmp/s3 && . /tmp/s3/s3.env
#      (path-style URLs only: $S3_ENDPOINT/$S3_BUCKET/KEY; region us-east-1)
#
# Ports: one run of 12 consecutive free loopback ports, chosen at random outside the kernel's
# ephemeral range (as tests/integration/ports.sh does): rgw HTTP, mon, then 10 for the OSD's
# messengers. If a daemon cannot bind (another run took a port since the check), start begins
# again on other ports. Everything binds 127.0.0.1 (or S3_BIND) only, so several servers can run
# at once.
#
# Environment: S3_START_TIMEOUT (seconds, default 120: start fails, stopping what it started, when
# not ready by then), S3_BUCKET (default deltacast-test), S3_MEMSTORE_BYTES (the OSD's RAM store,
# default 2 GiB), S3_FIRST_PORT (the first try uses the 12 ports from this one, free or not: to
# test the retry), S3_BIND (default 127.0.0.1: the address every daemon binds and the endpoint
# written to s3.env; e.g. a network namespace's own address, so that clients in other namespaces
# reach radosgw: `ip netns exec NS env S3_BIND=10.201.0.1 scripts/s3-server.sh start DIR`).
#
# curl 7.88 (Debian 12) signs SigV4 (--aws-sigv4) but (a) does not send x-amz-content-sha256,
# which RGW requires (else SignatureDoesNotMatch): set it, and curl signs it; (b) signs the query
# string as written: write it canonical (keys sorted, values URI-encoded, / as %2F, a valueless
# key as "key=", e.g. ?uploads=).
set -uo pipefail

readonly EMPTY_SHA=e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855
readonly RGW_NAME=client.rgw.deltacast
readonly PORT_COUNT=12
BIND=${S3_BIND:-127.0.0.1}  # load_env takes it from s3.env's endpoint
SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

die() { echo "s3-server: $*" >&2; exit 1; }
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

usage() {
  sed -n '/^#   scripts\/s3-server.sh start/,/^#$/p' "${BASH_SOURCE[0]}" | sed 's/^#   //; /^#$/d' >&2
  exit 2
}

# set_dir DIR [create]: S3_DIR (absolute) and CEPH_CONF for the ceph tools.
set_dir() {
  [ -n "${1:-}" ] || usage
  if [ -n "${2:-}" ]; then mkdir -p "$1" || die "cannot create $1"; fi
  S3_DIR=$(cd "$1" 2>/dev/null && pwd) || die "no directory $1"
  export CEPH_CONF=$S3_DIR/ceph.conf
}

need_tools() {
  local t missing=()
  for t in ceph-mon ceph-osd radosgw radosgw-admin ceph ceph-authtool monmaptool uuidgen curl python3; do
    command -v "$t" >/dev/null 2>&1 || missing+=("$t")
  done
  [ ${#missing[@]} -eq 0 ] ||
    die "missing ${missing[*]}: run scripts/install-deps.sh --test (or scripts/s3-server.sh install)"
}

# alive PID: the process exists and is not a zombie (a killed daemon whose parent is gone may stay
# one where nothing reaps orphans).
alive() {
  local state
  state=$(sed 's/^.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1)
  [ -n "$state" ] && [ "$state" != Z ]
}

# ours PID: alive and a daemon of this DIR (its command line names DIR's ceph.conf), so a PID
# reused since is never signalled.
ours() {
  local pid=$1
  alive "$pid" || return 1
  tr '\0' '\n' <"/proc/$pid/cmdline" 2>/dev/null | grep -qxF "$CEPH_CONF"
}

# stop_daemon NAME SIGNAL: signal the daemon of NAME.pid, wait up to 10 s, then SIGKILL.
stop_daemon() {
  local sig=$2 f="$S3_DIR/$1.pid" pid
  [ -f "$f" ] || return 0
  pid=$(cat "$f")
  if [ -n "$pid" ] && ours "$pid"; then
    kill "-$sig" "$pid" 2>/dev/null
    for _ in $(seq 1 100); do ours "$pid" || break; sleep 0.1; done
    ours "$pid" && kill -KILL "$pid" 2>/dev/null
    for _ in $(seq 1 50); do ours "$pid" || break; sleep 0.1; done
  fi
  rm -f "$f"
}

stop_all() { stop_daemon rgw TERM; stop_daemon osd TERM; stop_daemon mon TERM; }

# free_ports N: the first of N consecutive free TCP ports on BIND, outside the ephemeral range.
free_ports() {
  python3 - "$1" "$BIND" <<'EOF'
import random, socket, sys
n = int(sys.argv[1])
try:
    low, high = map(int, open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[:2])
except (OSError, ValueError):
    low, high = 32768, 60999
# Never 29400-29699: the fixed ports of the examples and of the launcher tests (29500..29508).
starts = [b for b in list(range(20000, low - n)) + list(range(high + 1, 65536 - n)) if b + n <= 29400 or b > 29699]
def free(port):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((sys.argv[2], port))
            return True
        except OSError:
            return False
for _ in range(500):
    base = random.choice(starts)
    if all(free(base + i) for i in range(n)):
        print(base)
        sys.exit(0)
sys.exit("no run of free loopback ports")
EOF
}

random_hex() { python3 -c 'import secrets, sys; print(secrets.token_hex(int(sys.argv[1])))' "$1"; }

# A daemon that could not bind its port: start again on other ports.
bind_failed() { grep -qsE 'Address already in use|unable to bind|failed to bind' "$S3_DIR/log/$1".*; }

# launch NAME CHECK CMD...: run CMD in the background (stdin closed, output in log/NAME.out, PID in
# NAME.pid) until CHECK passes, relaunching it (3 tries) if it exits during startup (a 'wrong fsid'
# race of the osd was seen once). Returns 0 ready, 2 a port was taken, 1 otherwise.
launch() {
  local name=$1 check=$2 try pid; shift 2
  for try in 1 2 3; do
    "$@" </dev/null >>"$S3_DIR/log/$name.out" 2>&1 &
    pid=$!
    echo "$pid" >"$S3_DIR/$name.pid"
    while :; do
      alive "$pid" || break
      eval "$check" >/dev/null 2>&1 && return 0
      if [ "$(awk -v d="$DEADLINE" -v n="$(now)" 'BEGIN { print (n > d) }')" = 1 ]; then
        echo "s3-server: $name not ready within ${S3_START_TIMEOUT} s, see $S3_DIR/log" >&2
        return 1
      fi
      sleep 0.3
    done
    bind_failed "$name" && return 2
    echo "s3-server: $name exited during startup (try $try), see $S3_DIR/log/$name.*" >&2
  done
  return 1
}

ceph_cli() { timeout 30 ceph -c "$CEPH_CONF" --connect-timeout 5 "$@"; }
mon_up() { [ "$(ceph_cli fsid 2>/dev/null)" = "$FSID" ]; }
osd_up() { ceph_cli osd dump 2>/dev/null | grep -q '^osd.0 up'; }
rgw_up() { curl -sf -m 5 -o /dev/null "http://$BIND:$RGW_PORT/"; }

write_conf() {
  local asok="$S3_DIR/run/\$name.asok"
  # A Unix socket path has at most 107 bytes; the admin sockets are only for debugging.
  [ $((${#S3_DIR} + 30)) -lt 107 ] || asok=""
  cat >"$CEPH_CONF" <<EOF
# Written by scripts/s3-server.sh: a throw-away single-node cluster; ports picked at start.
[global]
fsid = $FSID
mon host = v1:$BIND:$MON_PORT
public addr = $BIND
cluster addr = $BIND
ms bind msgr2 = false
ms bind ipv6 = false
# a port taken (by another run, since the check) fails at once: start tries other ports
ms bind retry count = 1
ms bind retry delay = 1
ms bind port min = $OSD_PORT_MIN
ms bind port max = $OSD_PORT_MAX
auth cluster required = none
auth service required = none
auth client required = none
run dir = $S3_DIR/run
admin socket = $asok
log file = $S3_DIR/log/\$name.log
keyring = $S3_DIR/keyring
# size 1 is required: with the default size 3 on one OSD the PGs never go active and rgw never answers
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
osd crush chooseleaf type = 0
mon allow pool size one = true
mon warn on pool no redundancy = false
mon warn on insecure global id reclaim allowed = false
# the mon stops itself when its disk is nearly full: not for a test server
mon data avail warn = 1
mon data avail crit = 0
# the mon batches map updates for 1 s by default, which made each pool radosgw creates cost ~2 s
paxos propose interval = 0.05
# radosgw-admin (revoke-key) waits for every radosgw watching the cache objects to answer its
# notification, one that was killed (kill-rgw) too, until the OSD drops that watch: after 5 s
# without a ping rather than 30 (clients ping each watch every tick, so every 1 s rather than 5)
osd client watch timeout = 5
objecter tick interval = 1
[mon]
mon data = $S3_DIR/mon/\$id
[osd]
osd data = $S3_DIR/osd/\$id
osd objectstore = memstore
memstore device bytes = ${S3_MEMSTORE_BYTES:-2147483648}
osd memory target = 939524096
# no mon commands from the osd at boot (the crush entry is made by the script)
osd crush update on start = false
osd class update on start = false
[$RGW_NAME]
rgw data = $S3_DIR/rgw
rgw frontends = beast endpoint=$BIND:$RGW_PORT tcp_nodelay=1
# virtual-host addressing: BUCKET.localhost:PORT (curl resolves *.localhost to loopback itself);
# requests to any other host name are path-style as before
rgw dns name = localhost
EOF
}

# start_once: one try on freshly picked ports. Returns 0 ready, 2 a port was taken, 1 otherwise.
start_once() {
  local base uuid rc
  if [ -n "${S3_FIRST_PORT:-}" ]; then  # the first try on given ports (to test the retry)
    base=$S3_FIRST_PORT
    unset S3_FIRST_PORT
  else
    base=$(free_ports $PORT_COUNT) || { echo "s3-server: no free ports on $BIND" >&2; return 1; }
  fi
  RGW_PORT=$base MON_PORT=$((base + 1)) OSD_PORT_MIN=$((base + 2)) OSD_PORT_MAX=$((base + PORT_COUNT - 1))
  FSID=$(uuidgen) uuid=$(uuidgen)
  rm -rf "${S3_DIR:?}"/{mon,osd,run,log,rgw,monmap,keyring,ceph.conf,s3.env}
  mkdir -p "$S3_DIR"/{mon,osd/0,run,log,rgw}
  write_conf
  ceph-authtool --create-keyring "$S3_DIR/keyring" --gen-key -n mon. --cap mon "allow *" >/dev/null &&
    monmaptool --create --fsid "$FSID" --addv a "[v1:$BIND:$MON_PORT]" "$S3_DIR/monmap" >/dev/null &&
    ceph-mon -c "$CEPH_CONF" --mkfs -i a --monmap "$S3_DIR/monmap" --keyring "$S3_DIR/keyring" \
      >"$S3_DIR/log/mon-mkfs.out" 2>&1 || { echo "s3-server: mon mkfs failed, see $S3_DIR/log" >&2; return 1; }
  launch mon mon_up ceph-mon -c "$CEPH_CONF" -f -i a; rc=$?; [ $rc -eq 0 ] || return $rc
  [ "$(ceph_cli osd new "$uuid" 2>>"$S3_DIR/log/setup.out")" = 0 ] &&
    ceph_cli osd crush add osd.0 1.0 root=default >>"$S3_DIR/log/setup.out" 2>&1 &&
    # (osd/0 exists already: memstore's mkfs asserts in MemStore::set_fsid when it is missing)
    ceph-osd -c "$CEPH_CONF" -i 0 --mkfs --osd-uuid "$uuid" >"$S3_DIR/log/osd-mkfs.out" 2>&1 ||
    { echo "s3-server: osd creation failed, see $S3_DIR/log" >&2; return 1; }
  launch osd osd_up ceph-osd -c "$CEPH_CONF" -f -i 0; rc=$?; [ $rc -eq 0 ] || return $rc
  launch rgw rgw_up radosgw -c "$CEPH_CONF" -f -n "$RGW_NAME"; rc=$?; [ $rc -eq 0 ] || return $rc
  timeout 60 radosgw-admin -c "$CEPH_CONF" user create --uid=deltacast --display-name=deltacast \
    --access-key="$S3_KEY" --secret-key="$S3_SECRET" >>"$S3_DIR/log/setup.out" 2>&1 ||
    { echo "s3-server: radosgw-admin user create failed, see $S3_DIR/log/setup.out" >&2; return 1; }
  # Our key works only on our radosgw: a 403 here means another server took the port.
  signed -X PUT "http://$BIND:$RGW_PORT/$S3_BUCKET" -o /dev/null 2>>"$S3_DIR/log/setup.out" ||
    { echo "s3-server: creating bucket $S3_BUCKET failed, see $S3_DIR/log/setup.out" >&2; return 2; }
}

cmd_start() {
  need_tools
  set_dir "$1" create
  # Only a directory of ours (or an empty one) is wiped.
  if [ -n "$(ls -A "$S3_DIR")" ] && ! grep -qs '^# Written by scripts/s3-server.sh' "$CEPH_CONF"; then
    die "$S3_DIR is not empty and not a server directory of this script; not touching it"
  fi
  stop_all
  rm -rf "$S3_DIR"/log.try*
  S3_START_TIMEOUT=${S3_START_TIMEOUT:-120}
  S3_BUCKET=${S3_BUCKET:-deltacast-test}
  local t0 attempt rc=1
  t0=$(now)
  DEADLINE=$(awk -v t="$t0" -v s="$S3_START_TIMEOUT" 'BEGIN { printf "%.3f", t + s }')
  S3_KEY=DC$(random_hex 9 | tr a-f A-F) S3_SECRET=$(random_hex 20)
  trap 'stop_all; exit 130' INT TERM
  for attempt in 1 2 3; do
    start_once; rc=$?
    [ $rc -eq 0 ] && break
    # Any other failure is retried too (once more at most), its logs kept: CI shows them below.
    [ $rc -eq 2 ] || [ "$attempt" -lt 3 ] || break
    if [ $rc -eq 2 ]; then
      echo "s3-server: a port was taken (try $attempt, $(elapsed "$t0") s), starting again on other ports" >&2
    else
      echo "s3-server: start failed (try $attempt, $(elapsed "$t0") s), starting again" >&2
    fi
    stop_all
    mv "$S3_DIR/log" "$S3_DIR/log.try$attempt"
  done
  if [ $rc -ne 0 ]; then
    stop_all
    for f in "$S3_DIR"/log*/*; do
      [ -f "$f" ] || continue
      echo "---- $f (last lines)" >&2
      tail -n 15 "$f" >&2
    done
    die "start failed after $(elapsed "$t0") s; logs in $S3_DIR/log"
  fi
  {
    printf 'S3_ENDPOINT=%s\n' "http://$BIND:$RGW_PORT"
    printf 'S3_REGION=us-east-1\n'
    printf 'S3_BUCKET=%s\n' "$S3_BUCKET"
    printf 'AWS_ACCESS_KEY_ID=%s\n' "$S3_KEY"
    printf 'AWS_SECRET_ACCESS_KEY=%s\n' "$S3_SECRET"
    printf 'S3_DIR=%q\n' "$S3_DIR"
  } >"$S3_DIR/s3.env.tmp" && mv "$S3_DIR/s3.env.tmp" "$S3_DIR/s3.env"
  trap - INT TERM
  echo "s3-server: ready at http://$BIND:$RGW_PORT (bucket $S3_BUCKET, env $S3_DIR/s3.env) in $(elapsed "$t0") s"
}

# load_env DIR: the server's s3.env (S3_ENDPOINT, keys, ...) and its radosgw port.
load_env() {
  set_dir "$1"
  [ -f "$S3_DIR/s3.env" ] || die "no $S3_DIR/s3.env: not started (scripts/s3-server.sh start $1)"
  # shellcheck disable=SC1091
  . "$S3_DIR/s3.env"
  S3_KEY=$AWS_ACCESS_KEY_ID S3_SECRET=$AWS_SECRET_ACCESS_KEY
  RGW_PORT=${S3_ENDPOINT##*:}
  BIND=${S3_ENDPOINT#http://} BIND=${BIND%:*}
}

# signed CURL-ARGS...: curl with SigV4 and the x-amz-content-sha256 header (PH, see the top).
signed() {
  curl -sS --fail-with-body -H "x-amz-content-sha256: ${PH:-$EMPTY_SHA}" \
    --aws-sigv4 "aws:amz:us-east-1:s3" --user "$S3_KEY:$S3_SECRET" "$@"
}

cmd_stop() {
  [ -n "${1:-}" ] || usage
  if [ ! -d "$1" ]; then echo "s3-server: nothing to stop ($1 does not exist)"; return 0; fi
  set_dir "$1"
  stop_all
  echo "s3-server: stopped ($S3_DIR)"
}

cmd_status() {
  load_env "$1"
  local name pid
  for name in mon osd rgw; do
    pid=$(cat "$S3_DIR/$name.pid" 2>/dev/null)
    if [ -n "$pid" ] && ours "$pid"; then echo "$name: running (pid $pid)"; else echo "$name: not running"; fi
  done
  if ! rgw_up; then echo "s3-server: not answering at $S3_ENDPOINT"; return 1; fi
  echo "s3-server: answering at $S3_ENDPOINT"
}

cmd_kill_rgw() {
  set_dir "$1"
  stop_daemon rgw KILL
  echo "s3-server: radosgw killed ($S3_DIR)"
}

cmd_restart_rgw() {
  load_env "$1"
  local t0 rc
  t0=$(now)
  stop_daemon rgw TERM
  S3_START_TIMEOUT=${S3_START_TIMEOUT:-60}
  DEADLINE=$(awk -v t="$t0" -v s="$S3_START_TIMEOUT" 'BEGIN { printf "%.3f", t + s }')
  launch rgw rgw_up radosgw -c "$CEPH_CONF" -f -n "$RGW_NAME"; rc=$?
  if [ $rc -ne 0 ]; then
    stop_daemon rgw KILL
    die "radosgw did not come back on port $RGW_PORT (logs in $S3_DIR/log)"
  fi
  echo "s3-server: radosgw back at $S3_ENDPOINT in $(elapsed "$t0") s"
}

rgw_admin() { timeout 60 radosgw-admin -c "$CEPH_CONF" "$@"; }

cmd_revoke_key() {
  load_env "$1"
  rgw_admin key rm --uid=deltacast --key-type=s3 --access-key="$S3_KEY" >/dev/null ||
    die "radosgw-admin key rm failed"
  echo "s3-server: key $S3_KEY revoked ($S3_DIR)"
}

cmd_restore_key() {
  load_env "$1"
  rgw_admin key create --uid=deltacast --key-type=s3 --access-key="$S3_KEY" --secret-key="$S3_SECRET" >/dev/null ||
    die "radosgw-admin key create failed"
  echo "s3-server: key $S3_KEY restored ($S3_DIR)"
}

cmd_admin() {
  load_env "$1"; shift
  rgw_admin "$@"
}

cmd_smoke() {
  load_env "$1"
  local t0 ep="$S3_ENDPOINT/$S3_BUCKET" w up e1 e2 code
  t0=$(now)
  w=$(mktemp -d)
  # shellcheck disable=SC2064
  trap "rm -rf '$w'" EXIT
  fail() { echo "s3-server: smoke FAILED: $*" >&2; exit 1; }
  sha() { sha256sum "$1" | cut -d' ' -f1; }
  etag() { tr -d '\r' | sed -n 's/^[Ee][Tt][Aa][Gg]: *//p'; }
  printf 'hello world' >"$w/o"
  PH=$(sha "$w/o") signed -X PUT -T "$w/o" "$ep/dir/o.txt" -o /dev/null || fail "PUT"
  [ "$(signed -H 'Range: bytes=6-10' "$ep/dir/o.txt")" = world ] || fail "Range GET"
  signed "$ep?list-type=2&prefix=dir%2F" | grep -q '<Key>dir/o.txt</Key>' || fail "ListObjectsV2"
  up=$(signed -X POST "$ep/mp.bin?uploads=" | sed -n 's:.*<UploadId>\(.*\)</UploadId>.*:\1:p')
  [ -n "$up" ] || fail "CreateMultipartUpload"
  head -c 5242880 /dev/urandom >"$w/p1"
  head -c 5242880 /dev/urandom >"$w/p2"
  e1=$(PH=$(sha "$w/p1") signed -X PUT -T "$w/p1" "$ep/mp.bin?partNumber=1&uploadId=$up" -D - -o /dev/null | etag)
  e2=$(PH=$(sha "$w/p2") signed -X PUT -T "$w/p2" "$ep/mp.bin?partNumber=2&uploadId=$up" -D - -o /dev/null | etag)
  [ -n "$e1" ] && [ -n "$e2" ] || fail "UploadPart"
  printf '<CompleteMultipartUpload>%s%s</CompleteMultipartUpload>' \
    "<Part><PartNumber>1</PartNumber><ETag>$e1</ETag></Part>" \
    "<Part><PartNumber>2</PartNumber><ETag>$e2</ETag></Part>" >"$w/c.xml"
  PH=$(sha "$w/c.xml") signed -X POST --data-binary @"$w/c.xml" "$ep/mp.bin?uploadId=$up" -o /dev/null ||
    fail "CompleteMultipartUpload"
  [ "$(signed "$ep/mp.bin" | sha256sum)" = "$(cat "$w/p1" "$w/p2" | sha256sum)" ] || fail "multipart GET"
  code=$(S3_SECRET=wrong signed -o /dev/null -w '%{http_code}' "$ep/dir/o.txt" 2>/dev/null)
  [ "$code" = 403 ] || fail "a wrong secret got HTTP $code, not 403"
  echo "s3-server: smoke OK (PUT, Range GET, ListObjectsV2, 2x5MiB multipart, wrong secret 403) in $(elapsed "$t0") s"
}

cmd_curl() {
  load_env "$1"; shift
  signed "$@"
}

case "${1:-}" in
  start) cmd_start "${2:-}" ;;
  stop) cmd_stop "${2:-}" ;;
  status) cmd_status "${2:-}" ;;
  smoke) cmd_smoke "${2:-}" ;;
  kill-rgw) cmd_kill_rgw "${2:-}" ;;
  restart-rgw) cmd_restart_rgw "${2:-}" ;;
  curl) [ $# -ge 2 ] || usage; shift; cmd_curl "$@" ;;
  revoke-key) cmd_revoke_key "${2:-}" ;;
  restore-key) cmd_restore_key "${2:-}" ;;
  admin) [ $# -ge 2 ] || usage; shift; cmd_admin "$@" ;;
  install) exec "$SCRIPT_DIR/install-deps.sh" --test ;;
  *) usage ;;
esac
