#!/bin/sh
# onboarding-agent preremove: stop the agent (it unregisters the workload and
# stops the sidecar) before its files go. On an upgrade the postinstall
# script of the new version restarts it.
set -e
if command -v systemctl >/dev/null && [ -d /run/systemd/system ]; then
	case "$1" in
	upgrade|1) ;; # deb upgrade, rpm upgrade (one version remains)
	*)
		systemctl stop onboarding-agent.service >/dev/null 2>&1 || true
		systemctl disable onboarding-agent.service >/dev/null 2>&1 || true
		;;
	esac
fi
exit 0
