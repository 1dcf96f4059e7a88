#!/bin/bash
# Stream mode's partition ring (`outbox partition`) against the plain table, with pgbench on
# the shared PostgreSQL: the write path (SCRIPTS, default 'one thousand': one-row and 1,000-row
# transactions; 2 clients, SECS (10) s a run, ROUNDS (5) rounds, each layout after a
# checkpoint, the order alternating; PGOPTIONS='-c synchronous_commit=off' takes the commit's
# fsync out), then one-row writers for 20 s without and with a rotation every 200 ms (ring of
# 4 x 3,000 transaction ids, positions moved to the current snapshot before each),
# per-transaction latency from pgbench's log. Needs the `outbox` binary (`cargo build
# --all-features`). Figures: docs/BENCHMARKS.md, hand notes ("The partition ring").
set -e
PG="-h ${PGHOST:-127.0.0.1} -U ${PGUSER:-postgres}"
BIN=$(realpath "${OUTBOX_BIN:-target/debug/outbox}")
cd "$(mktemp -d)"
cat > one.sql <<'SQL'
INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, event_version, payload, shard) VALUES ('order', (random()*1000)::int::text, 'E', 1, '{"total_cents": 1250}', (random()*255)::int);
SQL
cat > thousand.sql <<'SQL'
INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, event_version, payload, shard) SELECT 'order', (i % 1000)::text, 'E', 1, '{"total_cents": 1250}', i % 256 FROM generate_series(1, 1000) i;
SQL
setup() { # name, partition args or empty
  psql $PG -qc "DROP DATABASE IF EXISTS $1" -c "CREATE DATABASE $1" postgres 2>/dev/null
  $BIN migrate --database-url postgres://postgres@127.0.0.1/$1 >/dev/null
  if [ -n "$2" ]; then psql $PG -qAtc "SELECT outbox_partition_events($2)" $1 >/dev/null; fi
  # Every run starts after a checkpoint: a run of 1,000-row transactions writes hundreds of MB
  # of WAL, and the checkpoint it sets off would otherwise slow the run after it.
  psql $PG -qc "CHECKPOINT" $1
}
bench() { # db, script, secs -> tps
  pgbench $PG -n -c 2 -j 2 -T $3 -f $2 $1 2>/dev/null | awk '/^tps/ {print $3}'
}
# ROUNDS rounds (default 5), each layout after the other within a round so that both share
# the machine's noise; then the medians and ring / plain per script.
for round in $(seq "${ROUNDS:-5}"); do
  for script in ${SCRIPTS:-one thousand}; do
    # Which layout goes first alternates between rounds.
    for layout in $([ $((round % 2)) = 1 ] && echo plain ring || echo ring plain); do
      db=rot_$layout; args=""; [ $layout = ring ] && args="4, 10000000"
      setup $db "$args"
      echo "round $round $layout $script tps $(bench $db $script.sql ${SECS:-10})"
    done
  done
done | tee rounds.log
# gawk: arrays of arrays and asort.
gawk '{v[$3" "$4][++n[$3" "$4]]=$6} END {
  for (s in n) { m=asort(v[s]); med[s]=(m%2 ? v[s][(m+1)/2] : (v[s][m/2]+v[s][m/2+1])/2) }
  for (k in med) printf "median %s tps %.1f\n", k, med[k]
  for (s in n) if (s ~ /^ring / && (p = "plain " substr(s, 6)) in med)
    printf "ring / plain (medians), %s: %.3f\n", substr(s, 6), med[s] / med[p]
}' rounds.log
# Stalls: one-row writers for 30 s with a rotation every 200 ms (ring of 4 x 3,000 xids),
# against the same without rotations; per-transaction latency from pgbench's log.
stall() { # label, rotate?
  setup rot_stall "4, 3000"
  rm -f pgbench_log.*
  if [ "$2" = yes ]; then
    ( end=$((SECONDS+20)); while [ $SECONDS -lt $end ]; do
        psql $PG -qAt rot_stall -c "UPDATE outbox_stream_positions SET last_snapshot = pg_current_snapshot(), cur_snapshot = NULL" \
          -c "INSERT INTO outbox_stream_ticks VALUES (now(), pg_current_snapshot()) ON CONFLICT DO NOTHING" \
          -c "SELECT 'ROTATED', slot, bytes, clock_timestamp() FROM outbox_rotate_partitions('0 s', '200 ms')" ; sleep 0.2; done ) > rotations.log &
  fi
  pgbench $PG -n -c 2 -j 2 -T 20 -l -f one.sql rot_stall > /dev/null 2>&1
  wait
  cat pgbench_log.* | awk -v l="$1" '{n++; v[n]=$3} END {asort(v); printf "%s: %d transactions, p50 %.2f ms, p99 %.2f ms, p99.99 %.2f ms, max %.2f ms\n", l, n, v[int(n*0.5)]/1000, v[int(n*0.99)]/1000, v[int(n*0.9999)]/1000, v[n]/1000}'
  [ "$2" = yes ] && echo "  rotations: $(grep -c ROTATED rotations.log)"
  true
}
stall "no rotation" no
stall "rotation every 200 ms" yes
for d in rot_plain rot_ring rot_stall; do psql $PG -qc "DROP DATABASE IF EXISTS $d" postgres; done
