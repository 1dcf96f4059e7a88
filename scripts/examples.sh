#!/usr/bin/env bash
# Runs every example registered in Cargo.toml and fails if one fails. The teaching examples
# (docs/guide/) exit non-zero when the failure they reproduce does not happen or their fix does
# not hold. Builds all examples once (all features), then runs the binaries.
#
# Needs the services scripts/test.sh starts: PostgreSQL (DATABASE_URL, default
# postgres://postgres@127.0.0.1:5432/test), a Kafka-protocol broker (KAFKA_BROKERS, default
# 127.0.0.1:9092), and the PostgreSQL server binaries under /usr/lib/postgresql for the
# change-data-capture examples (they start a private cluster).
#
#   ./scripts/examples.sh                 # all
#   ./scripts/examples.sh polling_vs_cdc  # some
set -euo pipefail
cd "$(dirname "$0")/.."

mapfile -t all < <(sed -n 's/^name = "\(.*\)"$/\1/p' <(awk '/^\[\[example\]\]/{e=1;next} /^\[/{e=0} e' Cargo.toml))
if [ $# -gt 0 ]; then names=("$@"); else names=("${all[@]}"); fi

# `--workspace`: the same feature resolution as the test command's build, which has built them.
cargo build --quiet --workspace --examples --all-features
dir="${CARGO_TARGET_DIR:-target}/debug/examples"
failed=()
start=$(date +%s)
for name in "${names[@]}"; do
  printf '==> example %s\n' "$name"
  t0=$(date +%s)
  if "$dir/$name"; then
    printf '    (%s: %ss)\n' "$name" "$(( $(date +%s) - t0 ))"
  else
    failed+=("$name")
  fi
done
printf '==> %d examples in %ss' "${#names[@]}" "$(( $(date +%s) - start ))"
if [ ${#failed[@]} -gt 0 ]; then
  printf '; FAILED: %s\n' "${failed[*]}"
  exit 1
fi
printf ', all passed\n'
