#!/bin/sh
# onboarding-agent preremove: stop the agent (it unregisters the workload and
# asks for the sidecar to stop) before its files go. On an upgrade the
# postinstall script of the new version restarts it.
set -e
case "$1" in
upgrade|1) exit 0 ;; # deb upgrade, rpm upgrade (one version remains)
esac
if command -v systemctl >/dev/null && [ -d /run/systemd/system ]; then
	systemctl stop onboarding-agent.service >/dev/null 2>&1 || true
	systemctl disable onboarding-agent.service onboarding-agent-sidecar.path >/dev/null 2>&1 || true
	systemctl stop onboarding-agent-sidecar.path >/dev/null 2>&1 || true
fi
exit 0
