#!/usr/bin/env bash
# Writes a throwaway OpenPGP signing key for tests to <dir>/signing.asc
# (armored private key, no passphrase) and <dir>/public.asc, with the same
# gpg command docs/local-repository.md documents for a real key. Never use
# it for a repository VMs trust: `make packages` uses it only when
# PACKAGE_SIGNING_KEY is unset, and says so.
set -euo pipefail
dir=${1:?usage: test-signing-key.sh <dir>}
if [ -s "$dir/signing.asc" ]; then exit 0; fi
umask 077
mkdir -p "$dir"
export GNUPGHOME
GNUPGHOME=$(mktemp -d)
trap 'gpgconf --kill all 2>/dev/null || true; rm -rf "$GNUPGHOME"' EXIT
gpg --batch --quiet --passphrase '' --quick-gen-key 'Embark test repository key (throwaway) <embark-test@example.invalid>' rsa3072 sign 1y
gpg --batch --quiet --armor --export-secret-keys >"$dir/signing.asc.tmp"
gpg --batch --quiet --armor --export >"$dir/public.asc"
mv "$dir/signing.asc.tmp" "$dir/signing.asc"
