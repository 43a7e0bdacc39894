#!/bin/bash
# gantry-bootstrap: installs and enrolls the Gantry node agent on a freshly deployed
# machine. Written by cloud-init (deploy/cloud-init) and run once from runcmd as root.
#
# GANTRY_ROOT (unset on a real machine) makes it work inside a directory instead of /:
# the MAAS simulator (controlplane/internal/maas/maastest) runs this very script in a
# sandbox, where it unpacks the package with dpkg-deb -x and leaves starting the agent
# to the simulator instead of systemd.
set -euo pipefail

root="${GANTRY_ROOT:-}"
etc="$root/etc/gantry"
log() { echo "gantry-bootstrap: $*" >&2; }
die() { log "$*"; exit 1; }

# shellcheck source=/dev/null
. "$etc/bootstrap.env"
token_file="$etc/enrollment-token"
work="$(mktemp -d)"
# The enrollment token is one-time and lives only until enrollment ran, whatever happens.
trap 'rm -f "$token_file"; rm -rf "$work"' EXIT

curl_args=(--fail --silent --show-error --location --proto '=https,http' --connect-timeout 10 --max-time 600
	--retry 20 --retry-delay 3 --retry-all-errors)
server_ca=""
if [ -s "$etc/server-ca.pem" ]; then
	server_ca="$etc/server-ca.pem"
	curl_args+=(--cacert "$server_ca")
fi

log "fetching the node agent package from $GANTRY_PACKAGE_URL"
curl "${curl_args[@]}" -o "$work/gantry-nodeagent.deb" "$GANTRY_PACKAGE_URL"
curl "${curl_args[@]}" -o "$work/gantry-nodeagent.deb.sha256" "$GANTRY_PACKAGE_SHA256_URL"
want="$(cut -d' ' -f1 <"$work/gantry-nodeagent.deb.sha256")"
case "$want" in
[0-9a-f]*) [ "${#want}" -eq 64 ] || die "the served checksum is not a SHA-256" ;;
*) die "the served checksum is not a SHA-256" ;;
esac
if [ -n "$GANTRY_PACKAGE_SHA256" ] && [ "$want" != "$GANTRY_PACKAGE_SHA256" ]; then
	die "the served package ($want) is not the one this machine was deployed for ($GANTRY_PACKAGE_SHA256)"
fi
got="$(sha256sum "$work/gantry-nodeagent.deb" | cut -d' ' -f1)"
[ "$got" = "$want" ] || die "package checksum mismatch: got $got, want $want"

if [ -n "$root" ]; then
	dpkg-deb -x "$work/gantry-nodeagent.deb" "$root"
else
	DEBIAN_FRONTEND=noninteractive dpkg -i "$work/gantry-nodeagent.deb"
fi
# The allocation runtime goes to the unit's environment file (a conffile of the package:
# appended after installing, so dpkg never finds a foreign file in its place).
if [ -n "$GANTRY_RUNTIME" ]; then
	printf 'GANTRY_NODEAGENT_RUNTIME=%s\n' "$GANTRY_RUNTIME" >>"$etc/nodeagent.env"
fi
log "installed $(dpkg-deb -f "$work/gantry-nodeagent.deb" Package) $(dpkg-deb -f "$work/gantry-nodeagent.deb" Version)"

args=(enroll --config "$etc/nodeagent.conf" --server "$GANTRY_SERVER_URL")
[ -n "$server_ca" ] && args+=(--server-ca "$server_ca")
[ -n "$GANTRY_LOG_GATEWAY_URL" ] && args+=(--log-gateway "$GANTRY_LOG_GATEWAY_URL")
[ -n "$GANTRY_NODE_HOSTNAME" ] && args+=(--hostname "$GANTRY_NODE_HOSTNAME")
[ -n "$GANTRY_TRANSPORT" ] && args+=(--transport "$GANTRY_TRANSPORT")
# The token travels in the environment, never on the command line.
GANTRY_NODEAGENT_ENROLLMENT_TOKEN="$(cat "$token_file")" "$root/usr/bin/gantry-nodeagent" "${args[@]}"
rm -f "$token_file"

if [ -z "$root" ]; then
	systemctl daemon-reload
	systemctl enable --now gantry-nodeagent.service
	log "gantry-nodeagent enabled and started"
else
	log "sandbox root $root: not calling systemctl"
fi
