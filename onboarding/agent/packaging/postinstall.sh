#!/bin/sh
# onboarding-agent postinstall: the dedicated user, the sidecar's bootstrap
# directories it writes, and the systemd unit (enabled, started once the
# onboarding configuration is filled in).
set -e

if ! getent group onboarding-agent >/dev/null; then
	groupadd --system onboarding-agent
fi
if ! getent passwd onboarding-agent >/dev/null; then
	useradd --system --gid onboarding-agent --home-dir /var/lib/onboarding-agent \
		--no-create-home --shell /usr/sbin/nologin --comment "Embark onboarding agent" onboarding-agent
fi
# The Istio sidecar package's group reads the files the agent writes.
if getent group istio-proxy >/dev/null; then
	usermod --append --groups istio-proxy onboarding-agent || true
fi

# The agent writes the sidecar's bootstrap files into a directory of its own.
# The Istio directories stay owned by root (root-run Istio scripts source files
# from /var/lib/istio/envoy: the agent user must not be able to add any); only
# the three files the agent writes are symlinks into its directory.
install -d -m 0755 -o root -g root /var/lib/onboarding-agent
install -d -m 0755 -o onboarding-agent -g onboarding-agent /var/lib/onboarding-agent/sidecar
for link in /var/lib/istio/envoy/cluster.env:cluster.env /etc/istio/config/mesh:mesh /etc/certs/root-cert.pem:root-cert.pem; do
	path=${link%%:*}
	dir=$(dirname "$path")
	mkdir -p "$dir"
	# Undo the ownership earlier versions gave the agent user.
	chown root:root "$dir"
	chmod 0755 "$dir"
	ln -sfn "/var/lib/onboarding-agent/sidecar/${link##*:}" "$path"
done
if command -v systemd-tmpfiles >/dev/null; then
	systemd-tmpfiles --create /usr/lib/tmpfiles.d/onboarding-agent.conf || true
fi

if command -v systemctl >/dev/null && [ -d /run/systemd/system ]; then
	systemctl daemon-reload
	systemctl enable onboarding-agent.service >/dev/null 2>&1 || true
	# Restart on upgrade; on a first install the configuration is still empty.
	if systemctl is-active --quiet onboarding-agent.service; then
		systemctl restart onboarding-agent.service || true
	fi
fi
exit 0
