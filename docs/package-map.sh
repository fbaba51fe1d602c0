#!/usr/bin/env bash
# Prints the package map and the import graph of docs/architecture.md
# (the part between its "package map" markers) from `go list`: every
# package of the main module with the first sentence of its package
# comment (from its _test.go files for test-only packages), its non-test
# lines and files, then each package's imports of other Embark packages
# (non-test files only).
# Usage: docs/package-map.sh > /tmp/map.md   (run from the repository root)
set -euo pipefail
mod=$(go list -m)

first_sentence() { # the first sentence of a package comment, on one line
  tr '\n' ' ' | sed -E 's/[[:space:]]+/ /g; s/^ //' | sed -E 's/^(([^.]|\.[^ ])*\.)( .*)?$/\1/'
}

echo "| package | purpose | non-test lines | files |"
echo "| --- | --- | ---: | ---: |"
go list -f '{{.ImportPath}}|{{.Dir}}|{{join .GoFiles " "}}|{{join .TestGoFiles " "}} {{join .XTestGoFiles " "}}' ./... |
while IFS='|' read -r pkg dir files tests; do
  rel=${pkg#"$mod"}; rel=${rel#/}; [ -n "$rel" ] || rel=.
  doc=$(go list -f '{{.Doc}}' "$pkg")
  lines=0; n=0
  if [ -n "$files" ]; then
    lines=$(cd "$dir" && cat $files | wc -l); n=$(wc -w <<<"$files")
  fi
  if [ -z "$doc" ]; then # a test-only package: its comment is in a _test.go file
    for f in $tests; do
      doc=$(awk '/^package /{exit} /^\/\/ /{sub(/^\/\/ ?/, ""); print; next} {buf=""} ' "$dir/$f" | sed '/^[a-z]*:/d' | first_sentence)
      [ -n "$doc" ] && break
    done
    doc="(tests only) $doc"
  fi
  doc=$(first_sentence <<<"$doc" | sed -E 's/:[[:space:]]*$/./; s/\|/\\|/g')
  if [ ${#doc} -gt 200 ]; then doc="${doc:0:200}"; doc="${doc% *} …"; fi
  printf '| `%s` | %s | %s | %s |\n' "$rel" "$doc" "$lines" "$n"
done

echo
echo "Imports of other Embark packages (non-test files; \`api/...\` and \`version\` left out, as nearly every package imports them):"
echo
echo '```'
go list -f '{{.ImportPath}}|{{join .Imports " "}}' ./... |
while IFS='|' read -r pkg imports; do
  rel=${pkg#"$mod"}; rel=${rel#/}
  deps=$(for i in $imports; do
    case $i in "$mod"/api|"$mod"/api/*|"$mod"/version) ;; "$mod"/*) printf '%s ' "${i#"$mod"/}" ;; esac
  done)
  if [ -n "$deps" ]; then printf '%-40s -> %s\n' "$rel" "${deps% }"; fi
done
echo '```'
