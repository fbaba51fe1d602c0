#!/usr/bin/env bash
# Installs, upgrades and removes the onboarding-agent packages `make packages`
# built, with dpkg --root and rpm --root, maintainer scripts included, and
# checks users, ownership, modes, configuration files kept on upgrade and
# removal, the units (systemd-analyze verify, and security scoring the agent
# unit SAFE or OK), and that Istio's own istio-sidecar postinst (from the
# pinned Istio module) undoes nothing the agent's package set up.
#
# The throwaway root is an overlay of this host's own root filesystem in a
# private mount namespace (unshare -m): the maintainer scripts run chrooted
# with the host's real sh, useradd and install, every change lands in a
# temporary upper directory, and the host is untouched. This needs root (CI
# runs as root) and costs seconds, where a debootstrap chroot would download a
# distribution. systemd is not PID 1 here, as in a package build: the scripts
# skip systemctl, and the units are checked offline.
#
# usage: install-test.sh <packages dir> <nfpm binary> <version>
set -euo pipefail
dir=${1:?usage: install-test.sh <packages dir> <nfpm> <version>}
nfpm=${2:?nfpm binary}
version=${3:?version}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../../.." && pwd)
fail() { echo "install-test.sh: FAIL: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || fail "needs root (a mount namespace and chroot); CI runs as root"

if [ -z "${INSTALL_TEST_IN_NAMESPACE:-}" ]; then
	INSTALL_TEST_IN_NAMESPACE=1 exec unshare -m --propagation private "$0" "$@"
fi

arch=$(dpkg --print-architecture)
case "$arch" in amd64 | arm64) ;; *) fail "host architecture $arch has no package" ;; esac
rpmarch=$([ "$arch" = amd64 ] && echo x86_64 || echo aarch64)
work=$(mktemp -d)
trap 'umount -R "$work/root" 2>/dev/null || true; rm -rf "$work"' EXIT

# A second, newer version for the upgrade, from the same binary.
next="${version%%-*}.1"
[ "$next" != "$version" ] || next="$version.1"
# nfpm.yaml names its sources relative to the repository root: a tree of
# our own, so the shared _output/staging is left alone.
mkdir -p "$work/pkgs" "$work/src/_output/staging"
cp "$dir/../bin/linux_$arch/onboarding-agent" "$work/src/_output/staging/onboarding-agent"
ln -s "$repo/onboarding" "$work/src/onboarding"
for fmt in deb rpm; do
	(cd "$work/src" && ARCH=$arch VERSION=$next "$nfpm" package --config onboarding/agent/packaging/nfpm.yaml \
		--packager $fmt --target "$work/pkgs/next.$fmt" >/dev/null)
done

# fresh: a new overlay root at $work/root.
fresh() {
	umount -R "$work/root" 2>/dev/null || true
	rm -rf "$work/upper" "$work/ovl" "$work/root"
	mkdir -p "$work/upper" "$work/ovl" "$work/root"
	mount -t overlay overlay -o "lowerdir=/,upperdir=$work/upper,workdir=$work/ovl" "$work/root"
	mount --bind /dev "$work/root/dev"
	mount -t proc proc "$work/root/proc"
	# Nothing of a previous install on this host may leak in.
	rm -rf "$work/root/etc/onboarding-agent" "$work/root/var/lib/onboarding-agent" "$work/root/run/secrets" "$work/root/run/systemd/resolved.conf.d" \
		"$work/root/var/lib/istio" "$work/root/etc/istio" "$work/root/etc/certs"
}
R() { chroot "$work/root" "$@"; }
# legacy_dropin: the global resolved drop-in an earlier version wrote.
legacy_dropin() {
	mkdir -p "$work/root/run/systemd/resolved.conf.d"
	echo "[Resolve]" >"$work/root/run/systemd/resolved.conf.d/onboarding-agent-mesh-dns.conf"
}
# with_mesh_link LOG CMD...: runs CMD (output to LOG) in a network namespace
# of its own holding a resolver link the agent made (embark-t0, with the
# agent's alias) and someone else's link (other0), then prints what is left
# of them: "embark-t0 other0", "other0", ...
with_mesh_link() {
	local log=$1
	shift
	unshare --net sh -c '
		log=$1; shift
		ip link add embark-t0 type veth peer name embark-t0p &&
			ip link set dev embark-t0 alias onboarding-agent-mesh-dns &&
			ip link add other0 type veth peer name other0p || exit 1
		"$@" >"$log" 2>&1 || { echo failed; exit 0; }
		for l in embark-t0 other0; do ip link show dev "$l" >/dev/null 2>&1 && printf "%s " "$l"; done
		echo
	' sh "$log" "$@"
}
# expect PATH OWNER:GROUP MODE
expect() {
	local got
	got=$(R stat -c '%U:%G %a' "$1") || fail "$1 missing"
	[ "$got" = "$2 $3" ] || fail "$1 is $got, want $2 $3"
}
absent() { ! R test -e "$1" || fail "$1 still exists"; }

# Users, ownership and modes after a first install.
check_installed() {
	local fmt=$1
	R getent passwd onboarding-agent | grep -q ':/var/lib/onboarding-agent:/usr/sbin/nologin$' || fail "$fmt: onboarding-agent user"
	uid=$(R id -u onboarding-agent)
	[ "$uid" -lt 1000 ] || fail "$fmt: onboarding-agent is not a system user ($uid)"
	R getent passwd istio-proxy | grep -q ':/var/lib/istio:' || fail "$fmt: istio-proxy user as Istio creates it"
	! R id -nG onboarding-agent | grep -qw istio-proxy || fail "$fmt: onboarding-agent needs no istio-proxy membership"
	expect /usr/bin/onboarding-agent root:root 755
	for u in onboarding-agent.service onboarding-agent-sidecar.service onboarding-agent-sidecar.path; do
		expect /usr/lib/systemd/system/$u root:root 644
	done
	expect /etc/onboarding-agent root:root 755
	expect /etc/onboarding-agent/agent.config.yaml root:root 644
	expect /etc/onboarding-agent/onboarding.config.yaml root:root 644
	expect /var/lib/onboarding-agent onboarding-agent:onboarding-agent 750
	expect /var/lib/onboarding-agent/sidecar onboarding-agent:onboarding-agent 750
	expect /run/secrets/tokens onboarding-agent:istio-proxy 2750
	# Mesh DNS (docs/dns.md): the sidecar unit reads resolved's uplink
	# servers; the host's resolver is left alone until the sidecar answers
	# (no drop-in: the agent gives the sidecar a link at run time).
	expect /usr/lib/systemd/system/istio.service.d/onboarding-agent-dns.conf root:root 644
	R grep -qx 'BindReadOnlyPaths=-/run/systemd/resolve/resolv.conf:/etc/resolv.conf' \
		/usr/lib/systemd/system/istio.service.d/onboarding-agent-dns.conf || fail "$fmt: istio.service DNS drop-in"
	absent /run/systemd/resolved.conf.d/onboarding-agent-mesh-dns.conf
	absent /etc/sudoers.d/onboarding-agent
	# The agent owns nothing but its state and the token directory: no
	# directory a root process sources (Istio's /var/lib/istio/envoy is
	# istio-start.sh's, run as root).
	owned=$(cd "$work/upper" && find . -uid "$uid" | sort | tr '\n' ' ')
	[ "$owned" = "./run/secrets/tokens ./var/lib/onboarding-agent ./var/lib/onboarding-agent/sidecar " ] ||
		fail "$fmt: onboarding-agent owns $owned"
	for d in /var/lib/istio /etc/istio /etc/certs; do absent $d; done
	# The units, against this root (the binary is there).
	systemd-analyze verify --man=no --root="$work/root" \
		/usr/lib/systemd/system/onboarding-agent.service /usr/lib/systemd/system/onboarding-agent-sidecar.service \
		/usr/lib/systemd/system/onboarding-agent-sidecar.path 2>&1 | grep -v 'not found\|Failed to \(open\|prepare\)' >"$work/verify" || true
	# verify also reports the host's unrelated units it loads as dependencies; only ours count.
	if grep -q 'onboarding-agent' "$work/verify"; then cat "$work/verify" >&2; fail "$fmt: systemd-analyze verify"; fi
	score=$(systemd-analyze security --offline=true --root="$work/root" onboarding-agent.service 2>&1 | grep 'Overall exposure level') ||
		fail "$fmt: systemd-analyze security printed no score"
	grep -Eq ' (SAFE|OK) ' <<<"$score" || fail "$fmt: $score (want SAFE or OK)"
	echo "ok  $fmt: installed; users, ownership and modes; units verify; $score"
}

# --- DEB ---------------------------------------------------------------
fresh
dpkg --root="$work/root" --force-not-root -i "$dir/deb/$arch/onboarding-agent.deb" >"$work/log" 2>&1 || { cat "$work/log" >&2; fail "dpkg -i"; }
check_installed deb
# Istio's istio-sidecar postinst, from the pinned Istio module, after ours:
# it must leave the agent's setup alone (and reuse the istio-proxy user).
istio=$(cd "$repo/test/tools/istio" && go list -m -f '{{.Dir}}' istio.io/istio 2>/dev/null) ||
	istio=$(cd "$repo/test/tools/istio" && go mod download istio.io/istio && go list -m -f '{{.Dir}}' istio.io/istio)
mkdir -p "$work/root/usr/local/bin"
touch "$work/root/usr/local/bin/envoy" "$work/root/usr/local/bin/pilot-agent" # the sidecar package's binaries
cp "$istio/tools/packaging/postinst.sh" "$work/root/tmp/istio-postinst.sh"
R bash /tmp/istio-postinst.sh || fail "Istio's postinst failed after the agent's package"
expect /run/secrets/tokens onboarding-agent:istio-proxy 2750
expect /var/lib/onboarding-agent/sidecar onboarding-agent:onboarding-agent 750
expect /var/lib/istio/envoy istio-proxy:istio-proxy 755
[ "$(R readlink /etc/istio)" = /var/lib/istio ] || fail "Istio's /etc/istio symlink"
echo "ok  deb: Istio's istio-sidecar postinst after the agent's changes nothing of it"

# Upgrade: a locally edited configuration file and the staged state stay.
echo "# edited on this VM" >>"$work/root/etc/onboarding-agent/onboarding.config.yaml"
echo staged >"$work/root/var/lib/onboarding-agent/sidecar/cluster.env"
left=$(with_mesh_link "$work/log" dpkg --root="$work/root" --force-not-root --force-confold -i "$work/pkgs/next.deb") # the sidecar answers
[ "$left" != failed ] || { cat "$work/log" >&2; fail "dpkg upgrade"; }
[ "$left" = "embark-t0 other0 " ] || fail "deb: upgrade left the links '$left', want the running sidecar's resolver link kept"
expect /usr/lib/systemd/system/istio.service.d/onboarding-agent-dns.conf root:root 644
[ "$(dpkg-query --admindir="$work/root/var/lib/dpkg" -W -f '${Version}' onboarding-agent)" = "$next" ] || fail "deb: not upgraded to $next"
grep -q "edited on this VM" "$work/root/etc/onboarding-agent/onboarding.config.yaml" || fail "deb: upgrade replaced the edited configuration"
[ -s "$work/root/var/lib/onboarding-agent/sidecar/cluster.env" ] || fail "deb: upgrade lost the agent's state"
expect /var/lib/onboarding-agent onboarding-agent:onboarding-agent 750
echo "ok  deb: upgrade to $next keeps the edited configuration and the state"

# Removal keeps configuration files; purge removes them and the state. The
# sidecar's resolver link left in place (the sidecar was answering) goes
# with the package, and only it; so do an earlier version's drop-in and the
# sidecar unit's drop-in.
legacy_dropin
left=$(with_mesh_link "$work/log" dpkg --root="$work/root" --force-not-root -r onboarding-agent)
[ "$left" != failed ] || { cat "$work/log" >&2; fail "dpkg -r"; }
[ "$left" = "other0 " ] || fail "deb: removal left the links '$left', want only other0"
absent /usr/bin/onboarding-agent
absent /usr/lib/systemd/system/onboarding-agent.service
absent /usr/lib/systemd/system/istio.service.d/onboarding-agent-dns.conf
absent /run/systemd/resolved.conf.d/onboarding-agent-mesh-dns.conf
grep -q "edited on this VM" "$work/root/etc/onboarding-agent/onboarding.config.yaml" || fail "deb: removal lost the configuration"
dpkg --root="$work/root" --force-not-root -P onboarding-agent >"$work/log" 2>&1 || { cat "$work/log" >&2; fail "dpkg -P"; }
absent /etc/onboarding-agent/agent.config.yaml
absent /var/lib/onboarding-agent
echo "ok  deb: removal keeps the configuration files, purge removes them and the state"

# --- RPM ---------------------------------------------------------------
if ! command -v rpm >/dev/null; then fail "rpm missing: apt-get install -y rpm"; fi
fresh
rpmroot=(rpm --root="$work/root" --nodeps) # Debian's rpm database has no shadow-utils or systemd
rpmq=(rpm --root="$work/root")
"${rpmroot[@]}" -i "$dir/rpm/$arch/onboarding-agent.rpm" >"$work/log" 2>&1 || { cat "$work/log" >&2; fail "rpm -i"; }
[ "$("${rpmq[@]}" -q --queryformat '%{ARCH}' onboarding-agent)" = "$rpmarch" ] || fail "rpm: architecture"
check_installed rpm
echo "# edited on this VM" >>"$work/root/etc/onboarding-agent/onboarding.config.yaml"
left=$(with_mesh_link "$work/log" "${rpmroot[@]}" -U "$work/pkgs/next.rpm") # the sidecar answers
[ "$left" != failed ] || { cat "$work/log" >&2; fail "rpm -U"; }
[ "$left" = "embark-t0 other0 " ] || fail "rpm: upgrade left the links '$left', want the running sidecar's resolver link kept"
[ "$("${rpmq[@]}" -q --queryformat '%{VERSION}' onboarding-agent)" = "${next//-/_}" ] ||
	[ "$("${rpmq[@]}" -q --queryformat '%{VERSION}' onboarding-agent)" = "$next" ] || fail "rpm: not upgraded to $next"
grep -q "edited on this VM" "$work/root/etc/onboarding-agent/onboarding.config.yaml" || fail "rpm: upgrade replaced the edited configuration"
expect /var/lib/onboarding-agent onboarding-agent:onboarding-agent 750
echo "ok  rpm: upgrade to $next keeps the edited configuration and the state"
legacy_dropin
left=$(with_mesh_link "$work/log" "${rpmroot[@]}" -e onboarding-agent)
[ "$left" != failed ] || { cat "$work/log" >&2; fail "rpm -e"; }
[ "$left" = "other0 " ] || fail "rpm: removal left the links '$left', want only other0"
absent /usr/bin/onboarding-agent
absent /usr/lib/systemd/system/istio.service.d/onboarding-agent-dns.conf
absent /run/systemd/resolved.conf.d/onboarding-agent-mesh-dns.conf
absent /etc/onboarding-agent/agent.config.yaml # unedited: removed
grep -q "edited on this VM" "$work/root/etc/onboarding-agent/onboarding.config.yaml.rpmsave" || fail "rpm: removal did not save the edited configuration"
echo "ok  rpm: removal keeps the edited configuration as .rpmsave"
