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

for d in /var/lib/istio/envoy /etc/istio/config /etc/certs; do
	mkdir -p "$d"
	chown onboarding-agent:onboarding-agent "$d"
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
