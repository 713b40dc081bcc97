# Sourced by bench/real-libblkio.sh and bench/trixie-qemu.sh: download Debian trixie packages
# WITHOUT installing them. A private apt configuration under the cache dir (the host's apt state
# is untouched) downloads the .debs, and dpkg-deb extracts them into "$1/root".
# usage: trixie_fetch CACHE_DIR PACKAGE...
trixie_fetch() {
  local c=$1; shift
  local mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
  mkdir -p "$c/apt/lists/partial" "$c/apt/cache/archives/partial" "$c/debs" "$c/root"
  echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror trixie main" > "$c/apt/sources.list"
  : > "$c/apt/status"
  local o=(-o "Dir::Etc::SourceList=$c/apt/sources.list" -o Dir::Etc::SourceParts=/dev/null
    -o Dir::Etc::Preferences=/dev/null -o Dir::Etc::PreferencesParts=/dev/null
    -o "Dir::State::Lists=$c/apt/lists" -o "Dir::Cache=$c/apt/cache"
    -o "Dir::State::Status=$c/apt/status" -o APT::Architectures=amd64 -o Acquire::Languages=none
    -o Acquire::IndexTargets::deb::DEP-11::DefaultEnabled=false
    -o Acquire::IndexTargets::deb::DEP-11-icons::DefaultEnabled=false
    -o Acquire::IndexTargets::deb::Contents-deb::DefaultEnabled=false)
  apt-get "${o[@]}" -qq update >&2
  (cd "$c/debs" && apt-get "${o[@]}" -qq download "$@" >&2)
  local d
  for d in "$c"/debs/*.deb; do dpkg-deb -x "$d" "$c/root"; done
}
