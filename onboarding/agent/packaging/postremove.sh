#!/bin/sh
# onboarding-agent postremove: on purge (deb), remove the agent's state. The
# users stay (files may still belong to them); configuration files are kept
# on removal and removed by dpkg on purge.
set -e
if [ "$1" = purge ]; then
	rm -rf /var/lib/onboarding-agent
fi
if command -v systemctl >/dev/null && [ -d /run/systemd/system ]; then
	systemctl daemon-reload || true
fi
exit 0
