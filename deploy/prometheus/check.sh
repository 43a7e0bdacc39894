#!/bin/sh
# Validates the monitoring configuration: the Prometheus config and rules, the rules'
# unit tests (promtool, Debian package `prometheus`) and the Alertmanager config (amtool,
# Debian package `prometheus-alertmanager`). PROMTOOL and AMTOOL name other binaries.
set -eu
cd "$(dirname "$0")"
PROMTOOL=${PROMTOOL:-promtool}
AMTOOL=${AMTOOL:-amtool}
if ! command -v "$PROMTOOL" >/dev/null 2>&1; then
	echo "check.sh: promtool not found (apt-get install prometheus, or set PROMTOOL)" >&2
	exit 2
fi
"$PROMTOOL" check rules ./*.rules.yml
"$PROMTOOL" test rules tests/*.test.yml
"$PROMTOOL" check config --syntax-only prometheus.yml
if ! command -v "$AMTOOL" >/dev/null 2>&1; then
	echo "check.sh: amtool not found (apt-get install prometheus-alertmanager, or set AMTOOL)" >&2
	exit 2
fi
"$AMTOOL" check-config ../alertmanager/alertmanager.yml
