#!/usr/bin/env bash
# Checks the signatures `make packages` put on the onboarding-agent packages
# with the distributions' own verifiers and only the repository's public
# key: rpmkeys --checksig against a throwaway rpm database (as dnf does with
# gpgcheck=1), and gpgv on a DEB's _gpgorigin member over debian-binary,
# control.tar.gz and data.tar.gz (what debsig-verify checks). A package
# with one flipped byte, and a different key, are refused.
#
# usage: signature-check.sh <packages dir> <armored private key>
set -euo pipefail
dir=${1:?usage: signature-check.sh <packages dir> <key>}
key=${2:?armored private key}
fail() { echo "signature-check.sh: FAIL: $*" >&2; exit 1; }
work=$(mktemp -d)
export GNUPGHOME=$work/gnupg
trap 'gpgconf --kill all 2>/dev/null || true; rm -rf "$work"' EXIT
mkdir -m 700 "$GNUPGHOME"

# The public keys: the signing key's, and an unrelated one.
gpg --batch --quiet --import "$key"
gpg --batch --quiet --armor --export >"$work/public.asc"
gpg --batch --quiet --dearmor <"$work/public.asc" >"$work/public.gpg"
gpg --batch --quiet --passphrase '' --quick-gen-key 'Someone else <else@example.invalid>' rsa2048 sign 1d 2>/dev/null
fpr_else=$(gpg --batch --with-colons --list-keys else@example.invalid | awk -F: '/^fpr/ {print $10; exit}')
gpg --batch --quiet --export "$fpr_else" >"$work/other.gpg"
gpg --batch --quiet --armor --export "$fpr_else" >"$work/other.asc"

# flip FILE OUT: OUT is FILE with its middle byte inverted (in the payload:
# the binary is most of the package).
flip() {
	cp "$1" "$2"
	local size off byte
	size=$(stat -c %s "$1")
	off=$((size / 2))
	byte=$(od -An -tu1 -j "$off" -N1 "$1" | tr -d ' ')
	printf "$(printf '\\%03o' $((255 - byte)))" | dd of="$2" bs=1 seek="$off" conv=notrunc status=none
}

for arch in amd64 arm64; do
	# RPM: rpmkeys with a database holding only the repository key.
	rpmfile=$dir/rpm/$arch/onboarding-agent.rpm
	for k in public other; do
		rm -rf "$work/rpmdb-$k"
		mkdir -p "$work/rpmdb-$k"
		rpmkeys --dbpath "$work/rpmdb-$k" --import "$work/$k.asc"
	done
	out=$(rpmkeys --dbpath "$work/rpmdb-public" --checksig -v "$rpmfile" 2>&1) || fail "$rpmfile: rpmkeys --checksig: $out"
	grep -q 'Header V4 RSA/SHA256 Signature, key ID .*: OK' <<<"$out" || fail "$rpmfile is not signed: $out"
	! out=$(rpmkeys --dbpath "$work/rpmdb-other" --checksig "$rpmfile" 2>&1) || fail "$rpmfile verifies with another key: $out"
	flip "$rpmfile" "$work/tampered.rpm"
	! out=$(rpmkeys --dbpath "$work/rpmdb-public" --checksig "$work/tampered.rpm" 2>&1) || fail "a tampered $rpmfile verifies: $out"
	echo "ok  $rpmfile: signed (rpmkeys --checksig); another key and a flipped byte are refused"

	# DEB: the _gpgorigin signature over the concatenated members.
	deb=$dir/deb/$arch/onboarding-agent.deb
	[ "$(ar t "$deb" | tail -1)" = _gpgorigin ] || fail "$deb has no _gpgorigin signature"
	ar p "$deb" _gpgorigin >"$work/origin.asc"
	ar p "$deb" debian-binary control.tar.gz data.tar.gz >"$work/signed"
	gpgv --keyring "$work/public.gpg" "$work/origin.asc" "$work/signed" 2>"$work/log" || { cat "$work/log" >&2; fail "$deb: gpgv"; }
	! gpgv --keyring "$work/other.gpg" "$work/origin.asc" "$work/signed" 2>/dev/null || fail "$deb verifies with another key"
	flip "$deb" "$work/tampered.deb"
	ar p "$work/tampered.deb" debian-binary control.tar.gz data.tar.gz >"$work/signed"
	! gpgv --keyring "$work/public.gpg" "$work/origin.asc" "$work/signed" 2>/dev/null || fail "a tampered $deb verifies"
	echo "ok  $deb: signed (gpgv _gpgorigin); another key and a flipped byte are refused"
done
