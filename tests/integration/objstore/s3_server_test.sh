#!/usr/bin/env bash
# The test S3 server (scripts/s3-server.sh, fixture s3_server): its smoke checks, then radosgw
# killed in the middle of an upload and brought back on the same port:
#   - the interrupted upload fails on the client and leaves no object behind (PUT is all or nothing);
#   - an object written before the kill reads back bit-exact after the restart (the objects live in
#     the memstore OSD, not in radosgw);
#   - the same upload then succeeds, and the smoke checks pass again.
# Usage: s3_server_test.sh SCRIPTS/s3-server.sh DIR/s3.env
set -euo pipefail
S3_SERVER=$1
ENV_FILE=$2
[ -f "$ENV_FILE" ] || { echo "no $ENV_FILE: the s3_server fixture did not start" >&2; exit 1; }
# shellcheck disable=SC1090
. "$ENV_FILE"
for v in S3_ENDPOINT S3_REGION S3_BUCKET AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY S3_DIR; do
  [ -n "${!v:-}" ] || { echo "$ENV_FILE lacks $v" >&2; exit 1; }
done
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
s3() { bash "$S3_SERVER" curl "$S3_DIR" "$@"; }
sha() { sha256sum "$1" | cut -d' ' -f1; }
URL=$S3_ENDPOINT/$S3_BUCKET

bash "$S3_SERVER" smoke "$S3_DIR"

# An object written before radosgw goes down.
head -c 1048576 /dev/urandom >"$W/before"
PH=$(sha "$W/before") s3 -X PUT -T "$W/before" "$URL/restart/before.bin" -o /dev/null

# radosgw killed while a 16 MiB upload, capped at 4 MiB/s, is about half-way.
head -c 16777216 /dev/urandom >"$W/big"
PH=$(sha "$W/big") s3 -X PUT -T "$W/big" --limit-rate 4M "$URL/restart/big.bin" -o /dev/null 2>"$W/put.err" &
put=$!
sleep 2
bash "$S3_SERVER" kill-rgw "$S3_DIR"
if wait "$put"; then fail "the upload cut by the kill reported success"; fi
echo "interrupted upload failed on the client: $(head -c 200 "$W/put.err")"
if bash "$S3_SERVER" status "$S3_DIR" >/dev/null; then fail "status answered 0 with radosgw killed"; fi

bash "$S3_SERVER" restart-rgw "$S3_DIR"
bash "$S3_SERVER" status "$S3_DIR"

s3 "$URL/restart/before.bin" -o "$W/before.got"
cmp -s "$W/before" "$W/before.got" || fail "the object written before the restart differs after it"
echo "object written before the restart read back bit-exact"

code=$(s3 -o /dev/null -w '%{http_code}' "$URL/restart/big.bin" 2>/dev/null || true)
[ "$code" = 404 ] || fail "the interrupted upload left an object behind (GET: HTTP $code, want 404)"
echo "interrupted upload left no object (404)"

PH=$(sha "$W/big") s3 -X PUT -T "$W/big" "$URL/restart/big.bin" -o /dev/null
s3 "$URL/restart/big.bin" -o "$W/big.got"
cmp -s "$W/big" "$W/big.got" || fail "the upload repeated after the restart reads back different bytes"
echo "upload repeated after the restart: bit-exact"

bash "$S3_SERVER" smoke "$S3_DIR"
echo "s3_server_test: OK"
