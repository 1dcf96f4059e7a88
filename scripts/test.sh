#!/usr/bin/env bash
# The project's test command: installs and starts what the tests need, then runs every check
# and test. Idempotent; works on a fresh development machine and on a plain Debian machine
# with only Rust installed.
#
#   ./scripts/test.sh            # everything: services, fmt, clippy, all tests
#
# Environment:
#   OUTBOX_TEST_POSTGRES_URL  admin URL the tests create databases on
#                             (default postgres://postgres@127.0.0.1:5432/test)
#   OUTBOX_TEST_MYSQL_URL     same for MySQL/MariaDB (default mysql://root@127.0.0.1:3306/test)
#   OUTBOX_SKIP_SERVICES=1    do not install or start services (they are already running)
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '==> %s\n' "$*"; }
as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

apt_updated=0
apt_install() {
  local missing=()
  for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ $apt_updated -eq 0 ]; then as_root apt-get update -qq; apt_updated=1; fi
  log "installing ${missing[*]}"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
}

# --- build dependencies: a C toolchain, libpq, the MariaDB/MySQL client library, OpenSSL ----
# (librdkafka's TLS and SASL SCRAM link the system's OpenSSL).
apt_install gcc make pkg-config libpq-dev libmariadb-dev libmariadb-dev-compat libssl-dev
# For tests: PgBouncer (private instances in transaction mode); stunnel (TLS in front of a
# private tansu broker); the openssl command (an encrypted Kafka client key, an RSA MySQL
# client key).
apt_install pgbouncer stunnel4 openssl
# cargo-nextest runs the tests (see below); installed from crates.io where it is missing.
if ! cargo nextest --version >/dev/null 2>&1; then
  log "installing cargo-nextest"
  cargo install --locked cargo-nextest
fi

# --- PostgreSQL ------------------------------------------------------------------------------
start_postgres() {
  if pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; then return 0; fi
  local fresh=0
  if [ ! -d /etc/postgresql ] || [ -z "$(ls /etc/postgresql 2>/dev/null)" ]; then
    apt_install postgresql postgresql-client
    fresh=1
  fi
  apt_install postgresql-client
  local ver; ver=$(ls /etc/postgresql | sort -V | tail -n1)
  if [ $fresh -eq 1 ]; then
    # A server we installed ourselves: let local TCP connections in without a password, as on
    # the development machines (never done to a server that was already there).
    sed -i -E 's/^(host\s+all\s+all\s+(127\.0\.0\.1\/32|::1\/128)\s+)\S+/\1trust/' \
      "/etc/postgresql/$ver/main/pg_hba.conf"
  fi
  log "starting PostgreSQL $ver"
  as_root pg_ctlcluster --skip-systemctl-redirect "$ver" main start || true
  for _ in $(seq 1 60); do pg_isready -q -h 127.0.0.1 -p 5432 && break; sleep 0.5; done
  pg_isready -h 127.0.0.1 -p 5432
  if [ $fresh -eq 1 ]; then
    as_root su postgres -c "psql -qc \"CREATE ROLE root SUPERUSER LOGIN\"" 2>/dev/null || true
    as_root su postgres -c "createdb test" 2>/dev/null || true
  fi
}

# --- MariaDB ---------------------------------------------------------------------------------
mysql_up() { mysqladmin -h 127.0.0.1 -P 3306 -u root --connect-timeout=2 ping >/dev/null 2>&1; }
start_mariadb() {
  if mysql_up; then return 0; fi
  local fresh=0
  if [ ! -x /usr/sbin/mariadbd ]; then apt_install mariadb-server mariadb-client; fresh=1; fi
  log "starting MariaDB"
  as_root mkdir -p /run/mysqld && as_root chown mysql:mysql /run/mysqld 2>/dev/null || true
  as_root start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd -- --user=mysql
  for _ in $(seq 1 60); do
    mysql_up && break
    # A fresh install lets root in through the socket only: open TCP with an empty password.
    if [ $fresh -eq 1 ] && as_root mysql -e "SELECT 1" >/dev/null 2>&1; then
      as_root mysql -e "ALTER USER root@localhost IDENTIFIED VIA unix_socket OR mysql_native_password USING PASSWORD(''); CREATE DATABASE IF NOT EXISTS test;" || true
    fi
    sleep 0.5
  done
  mysql_up || { echo "MariaDB did not come up on 127.0.0.1:3306" >&2; exit 1; }
}

# --- NATS with JetStream, RabbitMQ ----------------------------------------------------------------
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
start_nats() {
  if port_open 4222; then return 0; fi
  apt_install nats-server
  log "starting NATS with JetStream"
  local dir=/var/tmp/outbox-nats
  as_root mkdir -p "$dir"
  as_root start-stop-daemon --start --oknodo --background --exec /usr/sbin/nats-server -- \
    -a 127.0.0.1 -p 4222 -js -sd "$dir"
  for _ in $(seq 1 60); do port_open 4222 && break; sleep 0.5; done
  port_open 4222 || { echo "NATS did not come up on 127.0.0.1:4222" >&2; exit 1; }
}
start_rabbitmq() {
  if port_open 5672; then return 0; fi
  apt_install rabbitmq-server
  log "starting RabbitMQ"
  as_root service rabbitmq-server start >/dev/null 2>&1 || as_root rabbitmq-server -detached
  for _ in $(seq 1 120); do port_open 5672 && break; sleep 0.5; done
  port_open 5672 || { echo "RabbitMQ did not come up on 127.0.0.1:5672" >&2; exit 1; }
}

if [ "${OUTBOX_SKIP_SERVICES:-0}" != 1 ]; then
  start_postgres
  start_mariadb
  # NATS (127.0.0.1:4222, JetStream) and RabbitMQ (127.0.0.1:5672, guest/guest) for the
  # `nats` and `rabbitmq` tests.
  start_nats
  start_rabbitmq
  # noida-db (127.0.0.1:9092) and tansu (127.0.0.1:9094) for outbox-core's `kafka` tests.
  ./scripts/kafka.sh start
  # Databases left by an interrupted earlier run (tests drop their own when they finish).
  for db in $(psql -h 127.0.0.1 -U postgres -d test -Atc \
      "SELECT datname FROM pg_database WHERE datname LIKE 'outbox\_t\_%'" 2>/dev/null); do
    psql -h 127.0.0.1 -U postgres -d test -qc "DROP DATABASE IF EXISTS $db WITH (FORCE)" || true
  done
  for db in $(mysql -h 127.0.0.1 -u root -Nse \
      "SELECT schema_name FROM information_schema.schemata WHERE schema_name LIKE 'outbox\_t\_%'" 2>/dev/null); do
    mysql -h 127.0.0.1 -u root -e "DROP DATABASE IF EXISTS $db" || true
  done
fi

# The test kit's `#[outbox::test]` reads the servers from these (the tests' own defaults).
export OUTBOX_TEST_POSTGRES_URL="${OUTBOX_TEST_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/test}"
export OUTBOX_TEST_MYSQL_URL="${OUTBOX_TEST_MYSQL_URL:-mysql://root@127.0.0.1:3306/test}"

# --- checks and tests --------------------------------------------------------------------------
# Each step prints its wall time, so a slow run says where its time went.
started=$SECONDS
# Runs a step and returns its status (called as `step … || rc=$?` inside run_tests, where
# `set -e` does not apply: the status is the step's, not that of the printf after it).
step() {
  local name=$1 t0=$SECONDS status=0
  shift
  log "$name"
  "$@" || status=$?
  printf '    (%s: %ss)\n' "$name" "$((SECONDS - t0))"
  return "$status"
}
step "cargo fmt --check" cargo fmt --all -- --check
step "cargo clippy" cargo clippy --workspace --all-targets --all-features -- -D warnings
step "packaged files (scripts/package-check.sh)" ./scripts/package-check.sh
# One build of every test target; then the tests run side by side, since they mostly wait on
# databases and brokers: cargo-nextest runs the test binaries' tests in parallel across
# binaries (.config/nextest.toml: how many at once, the slowest first), while beside it the UI
# tests compile (trybuild builds their dependencies and every case itself) and the doc tests
# run; then the examples. (cargo holds its build lock only while it builds, and
# every invocation selects the whole workspace with all features, so they resolve the same
# features and build nothing the first did not.)
beside() { # beside NAME CMD...: runs CMD in the background, its output to a log
  local name=$1 log
  shift
  log=$(mktemp)
  ( t0=$SECONDS; rc=0; "$@" >"$log" 2>&1 || rc=$?; printf '    (%s: %ss, rc %s)\n' "$name" "$((SECONDS - t0))" "$rc" >>"$log"; exit "$rc" ) &
  pids+=("$!"); names+=("$name"); logs+=("$log")
}
run_tests() {
  local pids=() names=() logs=() rc=0 i
  local million='test(/::cleanup_timing_1m$/)'
  # The compilers run at a lower priority: they take the cores the tests leave idle, and the
  # tests that bound a duration do not wait behind them.
  beside "UI tests" nice -n 10 cargo test --workspace --all-features --test ui
  beside "doc tests" nice -n 10 cargo test --workspace --all-features --doc
  cargo nextest run --workspace --all-features -E "not package(outbox-ui-tests) and not $million" || rc=$?
  # Every example, schema_evolution among them, from the build the tests made (all features),
  # once the tests are done: their relays run with two-second leases (a claim is cut off after
  # a third of that), and beside the 1,000,000-row retention tests one of them could not drain
  # 10,000 events in a minute.
  step "examples (scripts/examples.sh)" ./scripts/examples.sh || rc=$?
  # The 1,000,000-row retention tests last, one at a time (.config/nextest.toml), beside
  # nothing but the UI tests' niced compile: they time every cleanup statement, and their
  # fills and 1,000 deletes a server are disk-bound. Alone on the idle machine the MariaDB one
  # took 40 s; first among the other tests it took 420-454 s of CI's run and was its longest
  # path (the three in a row were 540 of nextest's 579 s).
  step "1,000,000-row retention tests (cargo nextest)" \
    cargo nextest run --workspace --all-features --profile million -E "$million" || rc=$?
  for i in "${!pids[@]}"; do
    wait "${pids[$i]}" || rc=$?
    log "${names[$i]} (run beside the others)"
    cat "${logs[$i]}"
    rm -f "${logs[$i]}"
  done
  return "$rc"
}
step "cargo test (build)" cargo test --workspace --all-features --no-run
step "tests (cargo nextest, UI, doc tests, examples)" run_tests
log "all checks and tests passed in $((SECONDS - started))s"
