#!/bin/sh
# onboarding-agent postinstall: the users, the state and token directories,
# and the systemd units (the agent is enabled and starts once the onboarding
# configuration is filled in). It touches nothing of Istio's istio-sidecar
# package: the root-run onboarding-agent-sidecar.service installs the
# sidecar's files.
set -e
umask 022

# istio-proxy exactly as Istio's own istio-sidecar postinst creates it (it
# skips creating it when the user exists), so that the token directory can
# belong to its group whichever package comes first.
if ! getent passwd istio-proxy >/dev/null; then
	getent group istio-proxy >/dev/null || groupadd --system istio-proxy
	useradd --system --gid istio-proxy --home-dir /var/lib/istio --no-create-home --shell /usr/sbin/nologin istio-proxy
fi
if ! getent group onboarding-agent >/dev/null; then
	groupadd --system onboarding-agent
fi
if ! getent passwd onboarding-agent >/dev/null; then
	useradd --system --gid onboarding-agent --home-dir /var/lib/onboarding-agent \
		--no-create-home --shell /usr/sbin/nologin --comment "Embark onboarding agent" onboarding-agent
fi

# The agent's own state: the staged bootstrap and requests. Root only reads
# it (through onboarding-agent-sidecar.service, which validates it).
install -d -o onboarding-agent -g onboarding-agent -m 0750 /var/lib/onboarding-agent
install -d -o onboarding-agent -g onboarding-agent -m 0750 /var/lib/onboarding-agent/sidecar
# The token directory now (tmpfiles.d recreates it at boot).
install -d -o root -g root -m 0755 /run/secrets
install -d -o onboarding-agent -g istio-proxy -m 2750 /run/secrets/tokens

if command -v systemctl >/dev/null && [ -d /run/systemd/system ]; then
	systemctl daemon-reload
	systemctl enable onboarding-agent.service onboarding-agent-sidecar.path >/dev/null 2>&1 || true
	systemctl start onboarding-agent-sidecar.path || true
	# Restart on upgrade; on a first install the configuration is still empty.
	if systemctl is-active --quiet onboarding-agent.service; then
		systemctl restart onboarding-agent.service || true
	fi
fi
exit 0
