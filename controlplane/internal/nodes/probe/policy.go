package probe

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// Reasons a target is denied (details.target_reason of the 400).
const (
	ReasonLoopback       = "loopback"
	ReasonUnspecified    = "unspecified"
	ReasonMulticast      = "multicast"
	ReasonLinkLocal      = "link_local"
	ReasonMetadata       = "cloud_metadata"
	ReasonBroadcast      = "broadcast"
	ReasonNotAllowlisted = "not_in_allowlist"
)

// metadata are the cloud instance-metadata endpoints (AWS, GCP, Azure, OCI share
// 169.254.169.254; AWS's IPv6 one; Alibaba's 100.100.100.200, which sits in the CGNAT
// range that is otherwise allowed; Azure's WireServer 168.63.129.16 and OCI's legacy
// 192.0.0.192, which sit in ranges that are otherwise allowed).
var metadata = []netip.Addr{
	netip.MustParseAddr("169.254.169.254"),
	netip.MustParseAddr("fd00:ec2::254"),
	netip.MustParseAddr("100.100.100.200"),
	netip.MustParseAddr("168.63.129.16"),
	netip.MustParseAddr("192.0.0.192"),
}

// metadataNames are the host names of cloud instance-metadata services. They are refused
// by name, before any resolution: on the cloud they name, they resolve to a metadata
// address the address check also refuses, but a resolver that answers otherwise (a split
// horizon, a search domain, a resolver swapped between check and use) must not be what
// keeps the probe off them. A name matches itself and any name under it.
var metadataNames = []string{
	"metadata.google.internal",     // GCP
	"metadata.goog",                // GCP
	"instance-data.ec2.internal",   // AWS (us-east-1; other regions under compute.internal, below)
	"metadata.azure.internal",      // Azure
	"metadata.azure.com",           // Azure
	"metadata.tencentyun.com",      // Tencent Cloud
	"metadata.platformequinix.com", // Equinix Metal
	"metadata.packet.net",          // Equinix Metal (legacy)
}

// metadataLabels are first labels that name a metadata service when the name is a single
// label (completed by the resolver's search list: "metadata" on GCP, "instance-data" on
// AWS) or lies under a cloud-internal zone (".internal": "metadata.c.<project>.internal",
// "instance-data.<region>.compute.internal").
var metadataLabels = []string{"metadata", "instance-data"}

var (
	thisNetwork = netip.MustParsePrefix("0.0.0.0/8")
	broadcast   = netip.MustParseAddr("255.255.255.255")
	nat64       = netip.MustParsePrefix("64:ff9b::/96")
	v4compat    = netip.MustParsePrefix("::/96")
)

// Policy decides which addresses the probe may connect to. The deny list is fixed and
// always wins; Allowed, when non-empty, is an allowlist on top (NODE_PROBE_ALLOWED_CIDRS).
// Private ranges are allowed unless the allowlist leaves them out: GPU nodes live there.
type Policy struct {
	Allowed []netip.Prefix
}

// ParseCIDRs reads NODE_PROBE_ALLOWED_CIDRS: comma-separated prefixes ("10.0.0.0/8,
// fd12::/16"); a bare address means just that address. Empty means no allowlist.
func ParseCIDRs(s string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		if !strings.Contains(part, "/") {
			a, err := netip.ParseAddr(part)
			if err != nil {
				return nil, fmt.Errorf("NODE_PROBE_ALLOWED_CIDRS: %q is not a CIDR", part)
			}
			out = append(out, netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()))
			continue
		}
		p, err := netip.ParsePrefix(part)
		if err != nil {
			return nil, fmt.Errorf("NODE_PROBE_ALLOWED_CIDRS: %q is not a CIDR", part)
		}
		if p.Addr().Is4In6() {
			p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// Check returns "" when a may be probed, else the reason it is denied.
func (p Policy) Check(a netip.Addr) string {
	if !a.IsValid() {
		return ReasonUnspecified
	}
	a = a.WithZone("")
	// IPv4 hidden in IPv6 (mapped ::ffff:a.b.c.d, the deprecated compatible ::a.b.c.d,
	// NAT64 64:ff9b::a.b.c.d) is judged as the IPv4 address it reaches.
	if a.Is4In6() {
		a = a.Unmap()
	} else if a.Is6() && (nat64.Contains(a) || (v4compat.Contains(a) && !a.IsLoopback() && !a.IsUnspecified())) {
		b := a.As16()
		a = netip.AddrFrom4([4]byte{b[12], b[13], b[14], b[15]})
	}
	for _, m := range metadata {
		if a == m {
			return ReasonMetadata
		}
	}
	switch {
	case a.IsLoopback():
		return ReasonLoopback
	case a.IsUnspecified(), a.Is4() && thisNetwork.Contains(a):
		return ReasonUnspecified
	case a.IsMulticast():
		return ReasonMulticast
	case a.IsLinkLocalUnicast(), a.IsLinkLocalMulticast():
		return ReasonLinkLocal
	case a == broadcast:
		return ReasonBroadcast
	}
	if len(p.Allowed) == 0 {
		return ""
	}
	for _, pr := range p.Allowed {
		if pr.Contains(a) {
			return ""
		}
	}
	return ReasonNotAllowlisted
}

// CheckName returns "" when a host name may be resolved and probed, else the reason it is
// denied by name alone: the cloud metadata names (ReasonMetadata) and "localhost" with
// every name under it (ReasonLoopback, RFC 6761 §6.3). name is compared case-insensitively
// and a trailing dot (the fully-qualified spelling) is ignored. The addresses a name
// resolves to are judged by Check as well; this is the part that needs no resolver.
func CheckName(name string) string {
	n := strings.ToLower(strings.TrimSuffix(strings.TrimSpace(name), "."))
	if n == "localhost" || strings.HasSuffix(n, ".localhost") {
		return ReasonLoopback
	}
	for _, m := range metadataNames {
		if n == m || strings.HasSuffix(n, "."+m) {
			return ReasonMetadata
		}
	}
	first, rest, _ := strings.Cut(n, ".")
	for _, l := range metadataLabels {
		if first == l && (rest == "" || rest == "internal" || strings.HasSuffix(rest, ".internal")) {
			return ReasonMetadata
		}
	}
	return ""
}

// ParseIPv4Loose reads the spellings inet_aton (and so getaddrinfo on most systems)
// accepts for an IPv4 address: one to four parts, each decimal, octal (leading 0) or hex
// (0x), the last part filling the remaining bytes — "2852039166", "0251.0376.0251.0376",
// "0xa9.0xfe.43518". ok is false for anything else (host names included).
func ParseIPv4Loose(s string) (netip.Addr, bool) {
	if s == "" || len(s) > 64 {
		return netip.Addr{}, false
	}
	parts := strings.Split(s, ".")
	if len(parts) > 4 {
		return netip.Addr{}, false
	}
	vals := make([]uint64, len(parts))
	for i, part := range parts {
		v, ok := parseAtonPart(part)
		if !ok {
			return netip.Addr{}, false
		}
		vals[i] = v
	}
	var n uint64
	last := len(vals) - 1
	for i := 0; i < last; i++ {
		if vals[i] > 0xff {
			return netip.Addr{}, false
		}
		n |= vals[i] << (8 * (3 - i))
	}
	if vals[last] >= 1<<(8*(4-last)) {
		return netip.Addr{}, false
	}
	n |= vals[last]
	return netip.AddrFrom4([4]byte{byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)}), true
}

func parseAtonPart(p string) (uint64, bool) {
	if p == "" {
		return 0, false
	}
	base, digits := 10, p
	switch {
	case len(p) > 1 && (p[:2] == "0x" || p[:2] == "0X"):
		base, digits = 16, p[2:]
		if digits == "" { // "0x" alone is 0 for inet_aton
			return 0, true
		}
	case len(p) > 1 && p[0] == '0':
		base, digits = 8, p[1:]
	}
	// ParseUint with an explicit base takes no sign, prefix or underscore.
	v, err := strconv.ParseUint(digits, base, 32)
	if err != nil {
		return 0, false
	}
	return v, true
}
