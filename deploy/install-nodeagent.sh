#!/usr/bin/env bash
# Installs the Gantry node agent on this host and enrolls it with the control plane, in
# one step:
#
#   sudo ./install-nodeagent.sh --server https://cp.example --token <enrollment token>
#
# It installs the binary to /usr/local/bin, the systemd unit to /etc/systemd/system,
# enrolls the host (writing /etc/gantry/nodeagent.conf, the 0600 node token and the
# fabric CA) and enables and (re)starts the service.
#
# Idempotent: running it again installs a newer binary or unit only when they differ,
# skips enrollment when this host is already enrolled with the same server (enrollment
# tokens are one-time; pass --reenroll with a fresh token to enroll again), and restarts
# the service only when something changed or it is not running.
#
# Options:
#   --server URL        control plane URL (required for enrollment)
#   --token TOKEN       one-time enrollment token (or env GANTRY_NODEAGENT_ENROLLMENT_TOKEN,
#                       which keeps it off the process list)
#   --binary PATH       the gantry-nodeagent binary (default: next to this script, or in
#                       ../bin/ of a source checkout)
#   --unit PATH         the unit file (default: systemd/gantry-nodeagent.service next to
#                       this script)
#   --transport MODE    auto (default), quic or tcp; stored in the configuration
#   --gpu-backend NAME  nvml (default) or mock-h100, mock-a100, mock-h200, mock-b200
#   --hostname NAME     hostname to report (default: the system's)
#   --server-ca PATH    CA (PEM) for the control plane's HTTPS, if not publicly trusted
#   --log-gateway URL   node log gateway to ship the agent's logs to
#   --reenroll          enroll even if already enrolled (needs a fresh token)
#   --root DIR          install under DIR instead of / (tests, image builds); implies
#                       --no-systemctl
#   --no-systemctl      do not call systemctl (containers, image builds)
set -euo pipefail

die() { echo "install-nodeagent: $*" >&2; exit 1; }
log() { echo "install-nodeagent: $*"; }

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
server="" token="${GANTRY_NODEAGENT_ENROLLMENT_TOKEN:-}" binary="" unit="" transport="" backend=""
host="" server_ca="" log_gateway="" reenroll=0 root="" systemctl=1

while [ $# -gt 0 ]; do
	case "$1" in
	--server) server="${2:?--server needs a value}"; shift 2 ;;
	--token) token="${2:?--token needs a value}"; shift 2 ;;
	--binary) binary="${2:?--binary needs a value}"; shift 2 ;;
	--unit) unit="${2:?--unit needs a value}"; shift 2 ;;
	--transport) transport="${2:?--transport needs a value}"; shift 2 ;;
	--gpu-backend) backend="${2:?--gpu-backend needs a value}"; shift 2 ;;
	--hostname) host="${2:?--hostname needs a value}"; shift 2 ;;
	--server-ca) server_ca="${2:?--server-ca needs a value}"; shift 2 ;;
	--log-gateway) log_gateway="${2:?--log-gateway needs a value}"; shift 2 ;;
	--reenroll) reenroll=1; shift ;;
	--root) root="${2:?--root needs a value}"; systemctl=0; shift 2 ;;
	--no-systemctl) systemctl=0; shift ;;
	-h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
	*) die "unknown option $1 (see --help)" ;;
	esac
done

if [ -z "$root" ] && [ "$(id -u)" -ne 0 ]; then
	die "run as root (it installs to /usr/local/bin and /etc)"
fi
root="${root%/}"

if [ -z "$binary" ]; then
	for c in "$here/gantry-nodeagent" "$here/../bin/gantry-nodeagent"; do
		if [ -x "$c" ]; then binary="$c"; break; fi
	done
fi
[ -n "$binary" ] && [ -x "$binary" ] || die "gantry-nodeagent binary not found; pass --binary PATH (make build puts it in bin/)"
[ -n "$unit" ] || unit="$here/systemd/gantry-nodeagent.service"
[ -f "$unit" ] || die "unit file $unit not found; pass --unit PATH"

bin_dst="$root/usr/local/bin/gantry-nodeagent"
unit_dst="$root/etc/systemd/system/gantry-nodeagent.service"
conf_dir="$root/etc/gantry"
conf="$conf_dir/nodeagent.conf"
changed=0

# install_if_changed SRC DST MODE: copies only when the content differs (atomic rename,
# so a running agent's binary is never overwritten in place).
install_if_changed() {
	local src="$1" dst="$2" mode="$3"
	if [ -f "$dst" ] && cmp -s "$src" "$dst"; then
		log "$dst is up to date"
		return
	fi
	mkdir -p "$(dirname "$dst")"
	install -m "$mode" "$src" "$dst.new"
	mv -f "$dst.new" "$dst"
	log "installed $dst"
	changed=1
}

install_if_changed "$binary" "$bin_dst" 0755
install_if_changed "$unit" "$unit_dst" 0644
mkdir -p "$conf_dir"
chmod 0755 "$conf_dir"

# config_value KEY: the value of KEY in the existing configuration ("" when absent).
config_value() {
	[ -f "$conf" ] || return 0
	sed -n "s/^[[:space:]]*$1[[:space:]]*=[[:space:]]*\"\{0,1\}\([^\"]*\)\"\{0,1\}[[:space:]]*$/\1/p" "$conf" | tail -n1
}

enrolled_node="$(config_value node_id)"
enrolled_server="$(config_value server_url)"
token_file="$(config_value token_file)"
case "$token_file" in "") token_file="$conf_dir/node-token" ;; /*) token_file="$root$token_file" ;; *) token_file="$conf_dir/$token_file" ;; esac

if [ "$reenroll" -eq 0 ] && [ -n "$enrolled_node" ] && [ -s "$token_file" ] &&
	{ [ -z "$server" ] || [ "${enrolled_server%/}" = "${server%/}" ]; }; then
	log "already enrolled as node $enrolled_node with ${enrolled_server}; skipping enrollment (--reenroll to redo)"
else
	[ -n "$server" ] || die "--server is required to enroll"
	[ -n "$token" ] || die "--token (or GANTRY_NODEAGENT_ENROLLMENT_TOKEN) is required to enroll"
	args=(enroll --config "$conf" --server "$server")
	[ -n "$transport" ] && args+=(--transport "$transport")
	[ -n "$backend" ] && args+=(--gpu-backend "$backend")
	[ -n "$host" ] && args+=(--hostname "$host")
	[ -n "$server_ca" ] && args+=(--server-ca "$server_ca")
	[ -n "$log_gateway" ] && args+=(--log-gateway "$log_gateway")
	# The token travels in the environment, not argv.
	GANTRY_NODEAGENT_ENROLLMENT_TOKEN="$token" "$bin_dst" "${args[@]}"
	changed=1
fi

if [ "$systemctl" -eq 1 ]; then
	systemctl daemon-reload
	systemctl enable gantry-nodeagent.service >/dev/null
	if [ "$changed" -eq 1 ] || ! systemctl is-active --quiet gantry-nodeagent.service; then
		systemctl restart gantry-nodeagent.service
		log "gantry-nodeagent (re)started; follow it with: journalctl -u gantry-nodeagent -f"
	else
		log "gantry-nodeagent already running and nothing changed"
	fi
else
	log "not calling systemctl; start it with: gantry-nodeagent run --config ${conf#"$root"}"
fi
