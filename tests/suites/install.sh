#!/usr/bin/env bash
# scripts/install.sh into a scratch prefix (and a DESTDIR-staged one): the binary runs and names
# its commit, man finds a page per command, bash loads the completion, pkg-config finds
# libblkio. Uses the release build (scripts/test.sh builds it; built here if missing).
# Ends with "N passed, N failed".
set -uo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
tgt=${CARGO_TARGET_DIR:-$root/target}
if [ ! -x "$tgt/release/snapblk" ] || [ ! -f "$tgt/release/libblkio.so" ]; then
  cargo build --release -p snapblk-cli -p snapblk-capi || { echo "FAIL: cargo build --release"; echo "0 passed, 1 failed"; exit 1; }
fi
work=$(mktemp -d /tmp/snapblk-install.XXXXXX)
trap 'rm -rf "$work"' EXIT
passed=0; failed=0
check() { # NAME COMMAND...
  local name=$1; shift
  if "$@" >"$work/out" 2>&1; then echo "PASS $name"; passed=$((passed+1));
  else echo "FAIL $name"; sed 's/^/  /' "$work/out"; failed=$((failed+1)); fi
}
p=$work/prefix
check "install.sh --prefix" bash scripts/install.sh --no-build --prefix "$p"
check "binary runs and names the commit" bash -c "'$p/bin/snapblk' --version | grep -qx 'snapblk .* (commit $(git rev-parse --short=12 HEAD))'"
for page in snapblk snapblk-cow-create snapblk-merge snapblk-readahead-replay snapblk-serve; do
  check "man finds $page" bash -c "MANPATH='$p/share/man' man -w $page | grep -qx '$p/share/man/man1/$page.1'"
done
check "every command has a page" bash -c "[ \$(ls '$p/share/man/man1' | wc -l) -ge 26 ]"
check "bash loads the completion" bash -c "source '$p/share/bash-completion/completions/snapblk' && complete -p snapblk"
check "zsh completion installed" test -s "$p/share/zsh/site-functions/_snapblk"
check "fish completion installed" test -s "$p/share/fish/vendor_completions.d/snapblk.fish"
check "pkg-config finds libblkio" bash -c "PKG_CONFIG_PATH='$p/lib/pkgconfig' pkg-config --libs blkio | grep -q -- '-L$p/lib'"
check "libblkio.so.1 installed" test -e "$p/lib/libblkio.so.1"
# DESTDIR: staged under DESTDIR, pkg-config file still names the final prefix.
check "DESTDIR staging" bash -c "DESTDIR='$work/stage' bash scripts/install.sh --no-build --prefix /opt/snapblk && test -x '$work/stage/opt/snapblk/bin/snapblk' && grep -q '^prefix=/opt/snapblk' '$work/stage/opt/snapblk/lib/pkgconfig/blkio.pc' && test ! -e /opt/snapblk"
check "unknown argument refused" bash -c "! bash scripts/install.sh --bogus 2>/dev/null"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
