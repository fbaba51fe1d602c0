#!/usr/bin/env bash
# Fails when git tracks (or is about to track: untracked, not ignored) a file
# over 2 MiB, or a binary executable: any ELF, Mach-O or PE file, or any file
# with an executable bit that is not text. Build outputs belong in bin/ and
# _output/, which are ignored.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
limit=$((2 * 1024 * 1024))
bad=0
files() { git ls-files -z --cached --others --exclude-standard; }

# Sizes, in one stat call per batch.
while read -r size name; do
  if [ "$size" -gt "$limit" ]; then echo "tracked file over 2 MiB: $name ($size bytes)" >&2; bad=1; fi
done < <(files | xargs -0 -r stat -c '%s %n' 2>/dev/null || true)

# Executable formats by their magic numbers, in any file.
while IFS= read -r -d '' name; do
  echo "tracked binary executable: $name" >&2; bad=1
done < <(files | xargs -0 -r grep -lZ --binary-files=binary -P '\A(\x7fELF|\xcf\xfa\xed\xfe|\xce\xfa\xed\xfe|MZ)' 2>/dev/null || true)

# Files with an executable bit that hold a NUL byte (not scripts).
while IFS= read -r -d '' name; do
  if [ -f "$name" ] && [ -x "$name" ] && LC_ALL=C grep -qP '\x00' <(head -c 8192 "$name"); then
    echo "tracked executable binary: $name" >&2; bad=1
  fi
done < <(files)

if [ "$bad" -ne 0 ]; then
  echo "remove these files from git (build outputs go to bin/ or _output/)" >&2
  exit 1
fi
