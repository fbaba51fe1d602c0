#!/usr/bin/env bash
# Unpacks Debian's systemd-resolved (the daemon and resolvectl, not
# installed: the machine's own resolver is left alone) into
# bin/testenv/systemd-resolved/ for the tests that run a VM's resolver
# (test/resolved). It runs from there against the machine's libsystemd-shared
# (package systemd) and beside dbus-daemon (package dbus-daemon).
# Skipped when the unpacked version is the candidate apt offers. What it
# runs beside (dbus-daemon, nsenter, ip, libsystemd-shared) is installed
# with apt-get when missing, so that `make demo` and `make test` work on a
# fresh Debian machine as the README says.
set -euo pipefail

missing=()
command -v dbus-daemon >/dev/null || missing+=(dbus-daemon)
command -v nsenter >/dev/null || missing+=(util-linux)
command -v ip >/dev/null || missing+=(iproute2)
compgen -G '/usr/lib/*/systemd/libsystemd-shared-*.so' >/dev/null || missing+=(systemd)
if [ ${#missing[@]} -gt 0 ]; then
  echo "testenv: apt-get install ${missing[*]} (the VM resolver tests run systemd-resolved beside them)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >/dev/null
  apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${TESTENV_BIN:-$root/bin/testenv}/systemd-resolved

candidate() { apt-cache policy systemd-resolved 2>/dev/null | awk '/Candidate:/ {print $2}'; }
version=$(candidate)
if [ -z "$version" ] || [ "$version" = "(none)" ]; then
  apt-get update -q >/dev/null
  version=$(candidate)
fi
if [ -z "$version" ] || [ "$version" = "(none)" ]; then
  echo "testenv: no systemd-resolved package in apt's sources" >&2
  exit 1
fi
if [ -x "$out/lib/systemd/systemd-resolved" ] && [ "$(cat "$out/.version" 2>/dev/null)" = "$version" ]; then
  echo "testenv: systemd-resolved $version is up to date"
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && apt-get download -q "systemd-resolved=$version" >/dev/null 2>&1 ||
  { apt-get update -q >/dev/null && apt-get download -q "systemd-resolved=$version"; })
rm -rf "$out"
mkdir -p "$out"
dpkg-deb -x "$tmp"/systemd-resolved_*.deb "$out"
echo "$version" >"$out/.version"
echo "testenv: systemd-resolved $version unpacked into $out"
