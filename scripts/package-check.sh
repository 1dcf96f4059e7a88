#!/usr/bin/env bash
# Checks what each published crate would ship, without building anything (`cargo package
# --list` takes about a second per crate): its sources, README and license files are in the
# package, outbox-diesel's migrations too, and no source file includes a file from outside its
# own package (which would build here, in the workspace, and fail for everyone who downloads
# the crate). `cargo publish --workspace --dry-run` is the full check (it builds every crate
# from its packaged files, about a minute and a half); this one is cheap enough for every test run.
#
#   ./scripts/package-check.sh
set -euo pipefail
cd "$(dirname "$0")/.."

failed=0
fail() {
  printf 'package-check: %s\n' "$*" >&2
  failed=1
}

# crate directory -> package name
declare -A crates=([.]=outbox [outbox-core]=outbox-kernel [outbox-derive]=outbox-derive [outbox-diesel]=outbox-diesel)

for dir in "${!crates[@]}"; do
  name=${crates[$dir]}
  list=$(cargo package --list --allow-dirty --quiet -p "$name")
  has() { grep -qxF "$1" <<<"$list"; }

  for f in Cargo.toml README.md LICENSE-MIT LICENSE-APACHE src/lib.rs; do
    has "$f" || fail "$name: $f is not in the package"
  done

  # Every source file under version control is packaged.
  srcdir=src
  [ "$dir" = . ] || srcdir=$dir/src
  sources=$(git ls-files -- "$srcdir")
  while IFS= read -r f; do
    [ -e "$f" ] || continue # deleted in the working tree
    has "${f#"$dir"/}" || fail "$name: ${f#"$dir"/} is not in the package"
  done <<<"$sources"

  # Every file a source includes (`include!`, `include_str!`, `include_bytes!`, also through
  # `concat!`) lies inside the package: the first string literal is the path, relative to the
  # including file.
  while IFS= read -r src; do
    [ -e "$src" ] || continue
    while IFS= read -r path; do
      [ -n "$path" ] || continue
      target=$(realpath -m "$(dirname "$src")/$path")
      root=$(realpath "$dir")
      case "$target" in
        "$root"/*) ;;
        *) fail "$name: $src includes $path, outside the package" ;;
      esac
      # A member crate's package never holds another member's files.
      if [ "$dir" = . ]; then
        for other in outbox-core outbox-derive outbox-diesel outbox-bench; do
          case "$target" in "$root/$other"/*) fail "$name: $src includes $path, in $other" ;; esac
        done
      fi
    done < <(grep -oE 'include(_str|_bytes)?!\((concat!\()?"[^"]*"' "$src" | sed -E 's/.*"([^"]*)"$/\1/')
  done < <(grep '\.rs$' <<<"$sources")
done

# The migrations outbox-diesel embeds are all in its package.
diesel_list=$(cargo package --list --allow-dirty --quiet -p outbox-diesel)
migrations=0
while IFS= read -r f; do
  [ -e "$f" ] || continue
  migrations=$((migrations + 1))
  grep -qxF "${f#outbox-diesel/}" <<<"$diesel_list" || fail "outbox-diesel: $f is not in the package"
done < <(git ls-files -- outbox-diesel/migrations)
[ "$migrations" -gt 0 ] || fail "outbox-diesel: no migrations under outbox-diesel/migrations"

if [ "$failed" -ne 0 ]; then
  exit 1
fi
printf 'package-check: outbox, outbox-kernel (outbox-core/), outbox-derive, outbox-diesel ship their sources, README, licenses and migrations\n'
