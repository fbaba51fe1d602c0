#!/usr/bin/env bash
# Reads back the onboarding-agent packages `make packages` built, with the
# distributions' own tools: dpkg-deb (DEB) and rpm (RPM; Debian's `rpm`
# package). Fails when a package lacks its binary, unit or config files, or
# has the wrong architecture.
set -euo pipefail
dir=${1:?usage: check.sh <packages dir>}
fail() { echo "check.sh: $*" >&2; exit 1; }

for arch in amd64 arm64; do
	deb=$dir/deb/$arch/onboarding-agent.deb
	[ -f "$deb" ] || fail "missing $deb"
	info=$(dpkg-deb --info "$deb")
	grep -q "Package: onboarding-agent" <<<"$info" || fail "$deb: wrong package name"
	grep -q "Architecture: $arch" <<<"$info" || fail "$deb: not $arch"
	contents=$(dpkg-deb --contents "$deb")
	for f in ./usr/bin/onboarding-agent ./usr/lib/systemd/system/onboarding-agent.service ./usr/lib/systemd/system/onboarding-agent-sidecar.path ./usr/lib/systemd/system/onboarding-agent-sidecar.service ./usr/lib/systemd/system/istio.service.d/onboarding-agent-dns.conf ./etc/onboarding-agent/agent.config.yaml; do
		grep -q " $f\$" <<<"$contents" || fail "$deb lacks $f"
	done
	conffiles=$(dpkg-deb --ctrl-tarfile "$deb" | tar -xOf - ./conffiles)
	for f in /etc/onboarding-agent/agent.config.yaml /etc/onboarding-agent/onboarding.config.yaml; do
		grep -qx "$f" <<<"$conffiles" || fail "$deb: $f is not a conffile"
	done
	ctrl=$(dpkg-deb --ctrl-tarfile "$deb" | tar -tf -)
	grep -qx './postinst' <<<"$ctrl" || fail "$deb has no postinst"
	echo "ok  $deb"

	rpmfile=$dir/rpm/$arch/onboarding-agent.rpm
	[ -f "$rpmfile" ] || fail "missing $rpmfile"
	if ! command -v rpm >/dev/null; then
		echo "skip $rpmfile: rpm not installed (apt-get install -y rpm)" >&2
		continue
	fi
	rpmarch=$([ "$arch" = amd64 ] && echo x86_64 || echo aarch64)
	# Outputs are captured first: `cmd | grep -q` would fail under pipefail
	# when grep exits before cmd has written everything.
	grep -q "^Name *: onboarding-agent" <<<"$(rpm -qip "$rpmfile")" || fail "$rpmfile: wrong package name"
	grep -qx "$rpmarch" <<<"$(rpm -qp --queryformat '%{ARCH}' "$rpmfile")" || fail "$rpmfile: not $rpmarch"
	grep -qx /usr/bin/onboarding-agent <<<"$(rpm -qlp "$rpmfile")" || fail "$rpmfile lacks the binary"
	grep -qx /etc/onboarding-agent/agent.config.yaml <<<"$(rpm -qcp "$rpmfile")" || fail "$rpmfile: agent.config.yaml is not a config file"
	grep -q useradd <<<"$(rpm -qp --scripts "$rpmfile")" || fail "$rpmfile: no postinstall creating the user"
	echo "ok  $rpmfile"
done
