#!/usr/bin/env bash
# The fault suite (tests/e2e/chaos), and docs/RELIABILITY.md from its figures.
#
#   ./scripts/chaos.sh              # full form: 100,000 events, 60 s outages (~10 minutes)
#   ./scripts/chaos.sh short        # the short form, as the test command runs it
#   ./scripts/chaos.sh full storm   # only the scenarios whose test name contains `storm`
#
# Each scenario appends its figures to docs/RELIABILITY.jsonl; then docs/RELIABILITY.md is
# rewritten from the newest row of each scenario (the hand-written notes below its marker are
# kept). The scenarios run one at a time: they measure latencies, and the machine is small.
# Needs the services of scripts/test.sh (PostgreSQL with its server binaries, the brokers of
# scripts/kafka.sh). OUTBOX_CHAOS_LABEL="..." labels the code measured (e.g. "before the fixes");
# OUTBOX_CHAOS_BIN=<path> runs that `outbox` binary instead of cargo's (a copy of a known build,
# when other checkouts share the target directory and may rebuild target/debug/outbox).
set -uo pipefail
cd "$(dirname "$0")/.."
form=${1:-full}
filter=${2:-}
case $form in full | short) ;; *) echo "usage: $0 [full|short] [test-name filter]" >&2; exit 2 ;; esac

# The test command's build (scripts/test.sh): nothing to compile twice.
features=(--all-features)
export OUTBOX_CHAOS=$form
export OUTBOX_CHAOS_REPORT=$PWD/docs/RELIABILITY.jsonl
export OUTBOX_CHAOS_COMMAND="scripts/chaos.sh $*"
export OUTBOX_CHAOS_COMMAND=${OUTBOX_CHAOS_COMMAND% }

cargo test "${features[@]}" --test e2e -- "${filter:-chaos_}" --skip chaos_render \
  --skip chaos_report --test-threads 1 --nocapture
status=$?

OUTBOX_CHAOS_RENDER=$PWD/docs/RELIABILITY.md \
  cargo test "${features[@]}" --test e2e -- --exact chaos::render::chaos_render_report --nocapture \
  || status=1
exit $status
