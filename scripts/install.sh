#!/usr/bin/env bash
# Install snapblk into PREFIX (default /usr/local): the `snapblk` binary, its bash/zsh/fish
# completions, a man page per command, and the libblkio library (crates/capi/install.sh).
# Usage: scripts/install.sh [--prefix PREFIX] [--no-build]
#   Builds the release binary and library first unless --no-build (then they must exist).
#   Honours CARGO_TARGET_DIR and DESTDIR (staged installs: files go to DESTDIR/PREFIX).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
prefix=/usr/local
build=1
while [ $# -gt 0 ]; do
  case "$1" in
    --prefix) prefix="${2:?--prefix needs a directory}"; shift 2 ;;
    --prefix=*) prefix="${1#--prefix=}"; shift ;;
    --no-build) build=0; shift ;;
    -h|--help) sed -n '2,6s/^# \{0,1\}//p' "$0"; exit 0 ;;
    *) echo "install.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
target="${CARGO_TARGET_DIR:-$root/target}"
if [ "$build" = 1 ]; then
  (cd "$root" && cargo build --release -p snapblk-cli -p snapblk-capi)
fi
bin="$target/release/snapblk"
[ -x "$bin" ] || { echo "install.sh: $bin missing: cargo build --release -p snapblk-cli" >&2; exit 1; }
dest="${DESTDIR:-}$prefix"
install -d "$dest/bin" "$dest/share/man/man1" \
  "$dest/share/bash-completion/completions" "$dest/share/zsh/site-functions" \
  "$dest/share/fish/vendor_completions.d"
install -m 0755 "$bin" "$dest/bin/snapblk"
"$bin" completions bash > "$dest/share/bash-completion/completions/snapblk"
"$bin" completions zsh > "$dest/share/zsh/site-functions/_snapblk"
"$bin" completions fish > "$dest/share/fish/vendor_completions.d/snapblk.fish"
"$bin" man "$dest/share/man/man1" > /dev/null
CARGO_TARGET_DIR="$target" DESTDIR="${DESTDIR:-}" bash "$root/crates/capi/install.sh" "$prefix"
echo "installed snapblk ($("$bin" --version)) into $dest"
