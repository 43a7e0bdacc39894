#!/bin/sh
# Validates the Prometheus rules and runs their unit tests with promtool (Debian package
# `prometheus`, or any promtool 2.x on PATH; PROMTOOL names another binary).
set -eu
cd "$(dirname "$0")"
PROMTOOL=${PROMTOOL:-promtool}
if ! command -v "$PROMTOOL" >/dev/null 2>&1; then
	echo "check.sh: promtool not found (apt-get install prometheus, or set PROMTOOL)" >&2
	exit 2
fi
"$PROMTOOL" check rules ./*.rules.yml
"$PROMTOOL" test rules tests/*.test.yml
