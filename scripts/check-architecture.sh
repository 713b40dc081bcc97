#!/usr/bin/env bash
# Checks that every `path:name` and `path` named in docs/ARCHITECTURE.md exists in the tree, so the
# map cannot rot: the file must exist and define the item (`fn`, `struct`, `enum`, `trait` or
# `impl` of that name; for `Type::method` both the type and the method).
set -uo pipefail
cd "$(dirname "$0")/.."
doc=docs/ARCHITECTURE.md
bad=0; n=0
defines() {  # defines FILE NAME
  grep -Eq "^\s*(pub(\([a-z]+\))? )?((async|unsafe|const|extern .C.) )*(fn|struct|enum|trait|type|mod) $2\b|^\s*(unsafe )?impl(<[^>]*>)? ([A-Za-z_:<>, ]+ for )?$2\b|^\s*(pub )?const $2\b" "$1"
}
while read -r ref; do
  n=$((n + 1))
  path=${ref%%:*}
  if [ ! -e "$path" ]; then echo "$doc: $ref: no file $path"; bad=1; continue; fi
  [ "$path" = "$ref" ] && continue
  item=${ref#*:}
  for part in ${item//::/ }; do
    defines "$path" "$part" || { echo "$doc: $ref: $path defines no '$part'"; bad=1; }
  done
done < <(grep -oE '`(crates|tests|scripts|bench)/[A-Za-z0-9_./-]+(:[A-Za-z_][A-Za-z0-9_]*(::[A-Za-z_][A-Za-z0-9_]*)*)?`' "$doc" | tr -d '`' | sort -u)
[ $n -gt 0 ] || { echo "$doc: no references found"; exit 1; }
[ $bad -eq 0 ] && echo "$doc: all $n references exist"
exit $bad
