#!/bin/sh
# onboarding-agent postremove: on purge (deb), remove the agent's state. The
# users stay (files may still belong to them); configuration files are kept
# on removal and removed by dpkg on purge.
set -e
if [ "$1" = purge ]; then
	rm -rf /var/lib/onboarding-agent
fi
# Removal (not an upgrade): the host resolver no longer sends the mesh
# domains to a sidecar. Its resolver link is normally gone already (stopping
# the agent stops the sidecar, which deletes it); any link the agent marked
# with its alias goes, whatever its name, and so does the global drop-in of
# earlier versions.
dns_dropin=/run/systemd/resolved.conf.d/onboarding-agent-mesh-dns.conf
case "$1" in
upgrade|1) ;;
*)
	if command -v ip >/dev/null; then
		ip -o link show 2>/dev/null |
			awk -F': ' '/\\ +alias onboarding-agent-mesh-dns$/ { split($2, n, "@"); print n[1] }' |
			while read -r link; do ip link delete dev "$link" || true; done
	fi
	if [ -e "$dns_dropin" ]; then
		rm -f "$dns_dropin"
		if command -v systemctl >/dev/null && [ -d /run/systemd/system ]; then
			systemctl try-reload-or-restart systemd-resolved.service || true
		fi
	fi
	;;
esac
if command -v systemctl >/dev/null && [ -d /run/systemd/system ]; then
	systemctl daemon-reload || true
fi
exit 0
