package probe_test

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gantry-gpu/gantry/controlplane/internal/nodes/probe"
)

// listener counts the connections it accepts.
type listener struct {
	ln       net.Listener
	accepted atomic.Int64
	port     uint16
}

func listen(t *testing.T, addr string) *listener {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	l := &listener{ln: ln, port: uint16(ln.Addr().(*net.TCPAddr).Port)}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			l.accepted.Add(1)
			_ = c.Close()
		}
	}()
	t.Cleanup(func() { _ = ln.Close() })
	return l
}

// resolver is a fixed table; it counts lookups.
type resolver struct {
	mu      sync.Mutex
	answers map[string][][]netip.Addr // successive answers per name; the last repeats
	calls   map[string]int
}

func (r *resolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.calls == nil {
		r.calls = map[string]int{}
	}
	n := r.calls[host]
	r.calls[host]++
	a, ok := r.answers[host]
	if !ok {
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	if n >= len(a) {
		n = len(a) - 1
	}
	return a[n], nil
}

func addrs(s ...string) []netip.Addr {
	out := make([]netip.Addr, len(s))
	for i, a := range s {
		out[i] = netip.MustParseAddr(a)
	}
	return out
}

// guarded is the production dialer with its Control calls counted.
type guarded struct {
	d       *net.Dialer
	control atomic.Int64
	dials   atomic.Int64
}

func newGuarded(p probe.Policy) *guarded {
	g := &guarded{}
	g.d = probe.GuardedDialer(p, 2*time.Second, func(netip.AddrPort, string) { g.control.Add(1) })
	return g
}

func (g *guarded) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	g.dials.Add(1)
	return g.d.DialContext(ctx, network, address)
}

func prober(p probe.Policy, r probe.Resolver, d probe.Dialer) *probe.Prober {
	pr := probe.New(p, 2*time.Second)
	pr.Resolver, pr.Dialer = r, d
	return pr
}

func TestDeniedTargetsMakeNoConnection(t *testing.T) {
	lo := listen(t, "127.0.0.1:0")
	cases := map[string]string{
		"127.0.0.1":              probe.ReasonLoopback,
		"127.8.9.10":             probe.ReasonLoopback,
		"::1":                    probe.ReasonLoopback,
		"[::1]":                  probe.ReasonLoopback,
		"::ffff:127.0.0.1":       probe.ReasonLoopback,
		"2130706433":             probe.ReasonLoopback, // decimal 127.0.0.1
		"0x7f.1":                 probe.ReasonLoopback,
		"017700000001":           probe.ReasonLoopback, // octal 127.0.0.1
		"0177.0.0.1":             probe.ReasonLoopback,
		"0.0.0.0":                probe.ReasonUnspecified,
		"0":                      probe.ReasonUnspecified,
		"0.1.2.3":                probe.ReasonUnspecified,
		"::":                     probe.ReasonUnspecified,
		"224.0.0.1":              probe.ReasonMulticast,
		"239.255.255.250":        probe.ReasonMulticast,
		"ff02::1":                probe.ReasonMulticast,
		"ff05::2":                probe.ReasonMulticast,
		"169.254.1.1":            probe.ReasonLinkLocal,
		"fe80::1":                probe.ReasonLinkLocal,
		"::ffff:169.254.1.1":     probe.ReasonLinkLocal,
		"255.255.255.255":        probe.ReasonBroadcast,
		"169.254.169.254":        probe.ReasonMetadata,
		"::ffff:169.254.169.254": probe.ReasonMetadata,
		"::ffff:a9fe:a9fe":       probe.ReasonMetadata,
		"64:ff9b::a9fe:a9fe":     probe.ReasonMetadata, // NAT64
		"::169.254.169.254":      probe.ReasonMetadata, // IPv4-compatible
		"2852039166":             probe.ReasonMetadata, // decimal
		"0251.0376.0251.0376":    probe.ReasonMetadata, // octal
		"0xa9fea9fe":             probe.ReasonMetadata, // hex
		"0xA9.0xFE.0xA9.0xFE":    probe.ReasonMetadata,
		"169.254.43518":          probe.ReasonMetadata, // a.b.c16
		"169.16689662":           probe.ReasonMetadata, // a.b24
		"fd00:ec2::254":          probe.ReasonMetadata,
		"FD00:EC2:0:0:0:0:0:254": probe.ReasonMetadata,
		"100.100.100.200":        probe.ReasonMetadata,
		"::ffff:100.100.100.200": probe.ReasonMetadata,
		"1684301000":             probe.ReasonMetadata, // decimal 100.100.100.200
		"0144.0144.0144.0310":    probe.ReasonMetadata, // octal 100.100.100.200
		"168.63.129.16":          probe.ReasonMetadata, // Azure WireServer
		"::ffff:168.63.129.16":   probe.ReasonMetadata,
		"192.0.0.192":            probe.ReasonMetadata, // OCI (legacy)
	}
	for target, reason := range cases {
		r := &resolver{}
		g := newGuarded(probe.Policy{})
		_, err := prober(probe.Policy{}, r, g).Probe(context.Background(), target, lo.port)
		var denied *probe.DeniedError
		if !errors.As(err, &denied) || denied.Reason != reason {
			t.Errorf("%s: got %v, want denied (%s)", target, err, reason)
		}
		if g.dials.Load() != 0 || g.control.Load() != 0 || len(r.calls) != 0 {
			t.Errorf("%s: %d dials, %d connect attempts, %d lookups; want none", target, g.dials.Load(), g.control.Load(), len(r.calls))
		}
	}
	if n := lo.accepted.Load(); n != 0 {
		t.Fatalf("loopback listener accepted %d connections", n)
	}
}

func TestHostnamesResolvingToDeniedTargets(t *testing.T) {
	lo := listen(t, "127.0.0.1:0")
	r := &resolver{answers: map[string][][]netip.Addr{
		"localhost":                {addrs("127.0.0.1", "::1")},
		"metadata.google.internal": {addrs("169.254.169.254")},
		"evil.example.com":         {addrs("10.0.0.5", "127.0.0.1")}, // one bad answer spoils the lot
		"mapped.example.com":       {addrs("::ffff:127.0.0.1")},
		"aws6.example.com":         {addrs("fd00:ec2::254")},
		"alibaba.example.com":      {addrs("100.100.100.200")},
		"mcast.example.com":        {addrs("ff02::1")},
	}}
	for host := range r.answers {
		g := newGuarded(probe.Policy{})
		_, err := prober(probe.Policy{}, r, g).Probe(context.Background(), host, lo.port)
		var denied *probe.DeniedError
		if !errors.As(err, &denied) {
			t.Errorf("%s: got %v, want denied", host, err)
		}
		if g.dials.Load() != 0 || g.control.Load() != 0 {
			t.Errorf("%s: %d dials, %d connect attempts; want none", host, g.dials.Load(), g.control.Load())
		}
	}
	if n := lo.accepted.Load(); n != 0 {
		t.Fatalf("loopback listener accepted %d connections", n)
	}
}

// recorder is a dialer seam that records what it was asked to dial and connects nothing.
type recorder struct {
	mu    sync.Mutex
	dials []string
	err   error
}

func (d *recorder) DialContext(_ context.Context, _, address string) (net.Conn, error) {
	d.mu.Lock()
	d.dials = append(d.dials, address)
	d.mu.Unlock()
	if d.err != nil {
		return nil, d.err
	}
	c1, c2 := net.Pipe()
	_ = c2.Close()
	return c1, nil
}

// A name is resolved once and the dial goes to that literal address: an answer that
// changes afterwards (DNS rebinding) is never dialled.
func TestRebindingIsNotFollowed(t *testing.T) {
	r := &resolver{answers: map[string][][]netip.Addr{
		"rebind.example.com": {addrs("10.1.2.3"), addrs("127.0.0.1")},
	}}
	d := &recorder{}
	res, err := prober(probe.Policy{}, r, d).Probe(context.Background(), "rebind.example.com", 22)
	if err != nil || !res.Reachable {
		t.Fatalf("probe: %+v %v", res, err)
	}
	if len(d.dials) != 1 || d.dials[0] != "10.1.2.3:22" || r.calls["rebind.example.com"] != 1 {
		t.Fatalf("dials %v after %d lookups; want exactly 10.1.2.3:22 after one", d.dials, r.calls["rebind.example.com"])
	}
	// The second answer is what a rebinding server would give a later lookup: denied.
	_, err = prober(probe.Policy{}, r, d).Probe(context.Background(), "rebind.example.com", 22)
	var denied *probe.DeniedError
	if !errors.As(err, &denied) || len(d.dials) != 1 {
		t.Fatalf("second probe: %v, dials %v", err, d.dials)
	}
}

// The production dialer checks the socket address itself, at connect time, whatever
// resolved it: a host name given straight to it that resolves to loopback never connects.
func TestGuardedDialerRefusesAtConnectTime(t *testing.T) {
	lo := listen(t, "127.0.0.1:0")
	g := newGuarded(probe.Policy{})
	port := strconv.Itoa(int(lo.port))
	for _, addr := range []string{"127.0.0.1:" + port, "localhost:" + port, "[::ffff:127.0.0.1]:" + port} {
		_, err := g.DialContext(context.Background(), "tcp", addr)
		var denied *probe.DeniedError
		if !errors.As(err, &denied) {
			t.Errorf("%s: got %v, want denied", addr, err)
		}
	}
	if g.control.Load() == 0 {
		t.Fatal("the Control hook never ran")
	}
	if n := lo.accepted.Load(); n != 0 {
		t.Fatalf("listener accepted %d connections", n)
	}
}

// hostIP is a non-loopback address of this machine, so a real connect can be allowed.
func hostIP(t *testing.T) netip.Addr {
	t.Helper()
	ifaces, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range ifaces {
		if p, err := netip.ParsePrefix(a.String()); err == nil {
			ip := p.Addr()
			if ip.Is4() && (probe.Policy{}).Check(ip) == "" {
				return ip
			}
		}
	}
	t.Fatal("this machine has no non-loopback IPv4 address to probe")
	return netip.Addr{}
}

func TestAllowedTargetConnects(t *testing.T) {
	ip := hostIP(t)
	l := listen(t, netip.AddrPortFrom(ip, 0).String())
	g := newGuarded(probe.Policy{})
	p := prober(probe.Policy{}, &resolver{}, g)
	res, err := p.Probe(context.Background(), ip.String(), l.port)
	if err != nil || !res.Reachable || res.Error != "" || res.Addr != netip.AddrPortFrom(ip, l.port) || res.Latency < 0 {
		t.Fatalf("probe: %+v %v", res, err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for l.accepted.Load() != 1 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if l.accepted.Load() != 1 || g.control.Load() != 1 {
		t.Fatalf("accepted %d, control %d; want 1, 1", l.accepted.Load(), g.control.Load())
	}
	// Nothing listening: reported, not an error.
	_ = l.ln.Close()
	res, err = p.Probe(context.Background(), ip.String(), l.port)
	if err != nil || res.Reachable || res.Error != probe.OutcomeRefused {
		t.Fatalf("closed port: %+v %v", res, err)
	}
	// A name that does not resolve.
	res, err = p.Probe(context.Background(), "nowhere.example.com", 22)
	if err != nil || res.Reachable || res.Error != probe.OutcomeResolveFailed || res.Addr.IsValid() {
		t.Fatalf("unresolvable: %+v %v", res, err)
	}
}

func TestPrivateRangesAllowedByDefault(t *testing.T) {
	for _, a := range []string{"10.0.0.1", "172.16.5.4", "192.168.1.10", "100.64.0.1", "fd12:3456::1", "192.0.2.2", "8.8.8.8", "2001:db8::1", "::ffff:10.0.0.1"} {
		if r := (probe.Policy{}).Check(netip.MustParseAddr(a)); r != "" {
			t.Errorf("%s denied (%s)", a, r)
		}
	}
}

func TestAllowlistEdges(t *testing.T) {
	allowed, err := probe.ParseCIDRs(" 10.0.0.0/24, fd12::/16,192.168.7.9 ,::ffff:172.16.0.0/116, 127.0.0.0/8")
	if err != nil {
		t.Fatal(err)
	}
	p := probe.Policy{Allowed: allowed}
	cases := map[string]string{
		"10.0.0.0":        "",
		"10.0.0.255":      "",
		"10.0.1.0":        probe.ReasonNotAllowlisted,
		"9.255.255.255":   probe.ReasonNotAllowlisted,
		"::ffff:10.0.0.7": "",
		"fd12::1":         "",
		"fd13::1":         probe.ReasonNotAllowlisted,
		"192.168.7.9":     "",
		"192.168.7.10":    probe.ReasonNotAllowlisted,
		"172.16.15.255":   "",
		"172.16.16.0":     probe.ReasonNotAllowlisted,
		"8.8.8.8":         probe.ReasonNotAllowlisted,
		// The deny list wins over the allowlist.
		"127.0.0.1":       probe.ReasonLoopback,
		"169.254.169.254": probe.ReasonMetadata,
	}
	for a, want := range cases {
		if got := p.Check(netip.MustParseAddr(a)); got != want {
			t.Errorf("%s: %q, want %q", a, got, want)
		}
	}
	if got, err := probe.ParseCIDRs(""); err != nil || got != nil {
		t.Fatalf("empty: %v %v", got, err)
	}
	for _, bad := range []string{"10.0.0.0/33", "nope", "1.2.3.4/", "10.0.0.0/8,x"} {
		if _, err := probe.ParseCIDRs(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	// A name resolving outside the allowlist is refused before connecting.
	d := &recorder{}
	r := &resolver{answers: map[string][][]netip.Addr{"gpu1.example.com": {addrs("10.0.2.1")}}}
	_, err = prober(p, r, d).Probe(context.Background(), "gpu1.example.com", 22)
	var denied *probe.DeniedError
	if !errors.As(err, &denied) || denied.Reason != probe.ReasonNotAllowlisted || len(d.dials) != 0 {
		t.Fatalf("outside allowlist: %v, dials %v", err, d.dials)
	}
}

func TestParseIPv4Loose(t *testing.T) {
	cases := map[string]string{
		"1.2.3.4":             "1.2.3.4",
		"2852039166":          "169.254.169.254",
		"0251.0376.0251.0376": "169.254.169.254",
		"0xa9fea9fe":          "169.254.169.254",
		"0XA9FEA9FE":          "169.254.169.254",
		"10.1":                "10.0.0.1",
		"10.1.2":              "10.1.0.2",
		"010.0.0.1":           "8.0.0.1",
		"0":                   "0.0.0.0",
		"4294967295":          "255.255.255.255",
	}
	for in, want := range cases {
		got, ok := probe.ParseIPv4Loose(in)
		if !ok || got.String() != want {
			t.Errorf("%q: %v %v, want %s", in, got, ok, want)
		}
	}
	for _, bad := range []string{"", "4294967296", "256.1.1.1", "1.2.3.4.5", "1.2.3.256", "1.2.65536", "08", "1..2", "a.b.c.d", "-1", "+1", "1_000", "example.com", " 1.2.3.4"} {
		if got, ok := probe.ParseIPv4Loose(bad); ok {
			t.Errorf("%q parsed as %v", bad, got)
		}
	}
}

func TestCanonical(t *testing.T) {
	cases := map[string]string{
		"GPU-01.Example.COM.": "gpu-01.example.com",
		"10.0.0.1":            "10.0.0.1",
		"[fd12::0001]":        "fd12::1",
		"::ffff:10.0.0.1":     "10.0.0.1",
		"012.0.0.1":           "10.0.0.1",
		"node7":               "node7",
	}
	for in, want := range cases {
		got, _, err := probe.Canonical(in)
		if err != nil || got != want {
			t.Errorf("%q: %q %v, want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "-bad.example.com", "bad-.example.com", "a..b", "under_score.example.com", "fe80::1%eth0", "http://10.0.0.1/", "10.0.0.1:22", "1.2.3.4.5", "x.123"} {
		if _, _, err := probe.Canonical(bad); !errors.Is(err, probe.ErrInvalidTarget) {
			t.Errorf("%q accepted", bad)
		}
	}
}

// The metadata host names are refused by name, before resolution: the resolver here
// answers every one of them with an allowed private address (a split horizon, a search
// domain, a swapped resolver), and still nothing is looked up or dialled.
func TestMetadataNamesDeniedByName(t *testing.T) {
	cases := map[string]string{
		"metadata.google.internal":                    probe.ReasonMetadata,
		"METADATA.Google.Internal":                    probe.ReasonMetadata,
		"metadata.google.internal.":                   probe.ReasonMetadata,
		"computemetadata.metadata.google.internal":    probe.ReasonMetadata,
		"metadata.goog":                               probe.ReasonMetadata,
		"metadata":                                    probe.ReasonMetadata,
		"Metadata.":                                   probe.ReasonMetadata,
		"metadata.c.my-project.internal":              probe.ReasonMetadata,
		"instance-data":                               probe.ReasonMetadata,
		"instance-data.ec2.internal":                  probe.ReasonMetadata,
		"instance-data.us-west-2.compute.internal":    probe.ReasonMetadata,
		"metadata.azure.internal":                     probe.ReasonMetadata,
		"metadata.azure.com":                          probe.ReasonMetadata,
		"metadata.tencentyun.com":                     probe.ReasonMetadata,
		"metadata.platformequinix.com":                probe.ReasonMetadata,
		"metadata.packet.net":                         probe.ReasonMetadata,
		"localhost":                                   probe.ReasonLoopback,
		"LocalHost.":                                  probe.ReasonLoopback,
		"gpu-1.localhost":                             probe.ReasonLoopback,
		"[metadata.google.internal]":                  probe.ReasonMetadata,
		"  metadata.google.internal  ":                probe.ReasonMetadata,
		"instance-data.eu-central-1.compute.internal": probe.ReasonMetadata,
	}
	lo := listen(t, "127.0.0.1:0")
	r := &resolver{answers: map[string][][]netip.Addr{}}
	for target := range cases {
		name, _, err := probe.Canonical(target)
		if err != nil {
			t.Fatalf("%q: %v", target, err)
		}
		r.answers[name] = [][]netip.Addr{addrs("10.0.0.7")}
	}
	for target, reason := range cases {
		g := newGuarded(probe.Policy{})
		_, err := prober(probe.Policy{}, r, g).Probe(context.Background(), target, lo.port)
		var denied *probe.DeniedError
		if !errors.As(err, &denied) || denied.Reason != reason || denied.Addr.IsValid() {
			t.Errorf("%q: got %v, want denied by name (%s)", target, err, reason)
		}
		if g.dials.Load() != 0 || g.control.Load() != 0 {
			t.Errorf("%q: %d dials, %d connect attempts; want none", target, g.dials.Load(), g.control.Load())
		}
		if got := probe.CheckName(target); got != reason && target[0] != '[' {
			t.Errorf("CheckName(%q) = %q, want %q", target, got, reason)
		}
	}
	if len(r.calls) != 0 {
		t.Errorf("denied names were looked up: %v", r.calls)
	}
	if n := lo.accepted.Load(); n != 0 {
		t.Fatalf("loopback listener accepted %d connections", n)
	}
}

// Names that merely contain a metadata word are ordinary names: they are resolved and
// judged on their addresses.
func TestNamesNearMetadataNamesAllowed(t *testing.T) {
	for _, name := range []string{
		"metadata.example.com", "gpu-metadata.internal", "instance-data-1.internal",
		"notmetadata.google.internal", "metadata.goog.example.com", "metadata-1", "mylocalhost",
		"localhost.example.com", "google.internal", "ec2.internal",
	} {
		if got := probe.CheckName(name); got != "" {
			t.Errorf("CheckName(%q) = %q, want allowed", name, got)
		}
		r := &resolver{answers: map[string][][]netip.Addr{name: {addrs("10.0.0.7")}}}
		d := &recorder{}
		res, err := prober(probe.Policy{}, r, d).Probe(context.Background(), name, 22)
		if err != nil || !res.Reachable || len(d.dials) != 1 || d.dials[0] != "10.0.0.7:22" {
			t.Errorf("%q: %+v %v, dials %v", name, res, err, d.dials)
		}
	}
}
