# Starts and stops one kvcached for the trace replays (tier_trace.sh,
# policy_trace.sh): sourced, not run. Listens on a unix socket only, no
# metrics endpoint, 64 KiB slabs, logging to $WORK/kvcached.log.
#
#   trace_daemon_start CONFIG HOST_BYTES [kvcached flags...]   waits until it answers
#   trace_daemon_stop
# Needs KVCACHED, CTL, WORK and SOCK; sets KV_PID (empty when stopped).
# Exits the calling script when the daemon does not answer within 20 s.

trace_daemon_start() {
  local config=$1 cap=$2
  shift 2
  rm -f "$SOCK"
  "$KVCACHED" --listen none --unix-socket "$SOCK" --metrics-address none --log-level warn \
    --capacity-bytes "$cap" --slab-bytes 65536 --config "$config" "$@" \
    >>"$WORK/kvcached.log" 2>&1 &
  KV_PID=$!
  for _ in $(seq 200); do
    "$CTL" -t "unix://$SOCK" --timeout 1 status >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "$(basename "$0"): kvcached did not start:" >&2
  tail -5 "$WORK/kvcached.log" >&2
  exit 1
}

trace_daemon_stop() {
  kill -TERM "$KV_PID" 2>/dev/null || true
  wait "$KV_PID" 2>/dev/null || true
  KV_PID=""
}
