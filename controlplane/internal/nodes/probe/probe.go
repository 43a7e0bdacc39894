// Package probe connects to a node's address over TCP and reports reachability and
// latency, without becoming an SSRF primitive: a target that is loopback, unspecified,
// multicast, link-local, broadcast or a cloud metadata endpoint — in any spelling
// (IPv4-mapped IPv6, NAT64, decimal "2852039166", octal "0251.0376.0251.0376", hex) or
// through a host name that resolves to one — is refused before any connection is made.
// The well-known metadata host names ("metadata.google.internal", "instance-data", ...)
// and "localhost" are refused by name, before they are resolved.
//
// The decision is taken on the resolved address: a name is resolved once, every address
// it resolves to must pass, and the dial goes to that literal address, so a DNS answer
// that changes between check and connect (rebinding) is never dialled. The production
// dialer checks again in net.Dialer.Control, on the socket address the kernel is about to
// connect to, so nothing can reach connect() without passing the policy. The probe speaks
// no application protocol, so there is no redirect to follow.
package probe

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/gantry-gpu/gantry/shared/clock"
)

// DefaultTimeout bounds one probe (resolution and connect).
const DefaultTimeout = 3 * time.Second

// DeniedError says the target may not be probed; no connection was made.
type DeniedError struct {
	Target string     // what was asked for
	Addr   netip.Addr // the address that was denied; invalid when the name itself was
	Reason string     // Reason* constant
}

func (e *DeniedError) Error() string {
	if !e.Addr.IsValid() {
		return fmt.Sprintf("probe target %q denied by name: %s", e.Target, e.Reason)
	}
	return fmt.Sprintf("probe target %q denied: %s (%s)", e.Target, e.Reason, e.Addr)
}

// ErrInvalidTarget is returned for something that is neither an IP address nor a host name.
var ErrInvalidTarget = errors.New("probe: not an IP address or host name")

// Resolver resolves host names (net.DefaultResolver in production).
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// Dialer makes the connection (GuardedDialer in production).
type Dialer interface {
	DialContext(ctx context.Context, network, address string) (net.Conn, error)
}

// Outcomes of a probe that was allowed (Result.Error).
const (
	OutcomeRefused       = "connection_refused"
	OutcomeTimeout       = "timeout"
	OutcomeUnreachable   = "unreachable"
	OutcomeResolveFailed = "resolve_failed"
	OutcomeFailed        = "connect_failed"
)

// Result is what a probe that was allowed found.
type Result struct {
	Target    string         // the canonical target
	Addr      netip.AddrPort // the address dialled (zero when resolution failed)
	Reachable bool
	Latency   time.Duration // time to connect, when reachable
	Error     string        // an Outcome* constant when not reachable
	At        time.Time
}

// Prober probes targets under a Policy.
type Prober struct {
	Policy   Policy
	Resolver Resolver
	Dialer   Dialer
	Timeout  time.Duration
	Clock    clock.Clock
}

// New returns a production prober: the system resolver and a GuardedDialer.
func New(policy Policy, timeout time.Duration) *Prober {
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	return &Prober{
		Policy: policy, Resolver: net.DefaultResolver, Timeout: timeout, Clock: clock.Real{},
		Dialer: GuardedDialer(policy, timeout, nil),
	}
}

// GuardedDialer is a net.Dialer whose Control hook refuses any socket address the policy
// denies, before connect(). observe, when set, sees every address the hook judged (tests
// count them).
func GuardedDialer(policy Policy, timeout time.Duration, observe func(netip.AddrPort, string)) *net.Dialer {
	return &net.Dialer{
		Timeout:   timeout,
		KeepAlive: -1,
		Control: func(network, address string, _ syscall.RawConn) error {
			ap, err := netip.ParseAddrPort(address)
			if err != nil {
				return &DeniedError{Target: address, Reason: ReasonUnspecified}
			}
			reason := policy.Check(ap.Addr())
			if observe != nil {
				observe(ap, reason)
			}
			if reason != "" {
				return &DeniedError{Target: address, Addr: ap.Addr(), Reason: reason}
			}
			return nil
		},
	}
}

// Canonical checks that target is an IP address (any spelling) or a host name and
// returns its canonical form; ip is valid when target is an IP address. It makes no
// policy decision.
func Canonical(target string) (canonical string, ip netip.Addr, err error) {
	t := strings.TrimSpace(target)
	if strings.HasPrefix(t, "[") && strings.HasSuffix(t, "]") {
		t = t[1 : len(t)-1]
	}
	if t == "" || len(t) > 253 {
		return "", netip.Addr{}, ErrInvalidTarget
	}
	if a, err := netip.ParseAddr(t); err == nil {
		if a.Zone() != "" {
			return "", netip.Addr{}, ErrInvalidTarget
		}
		if a.Is4In6() {
			a = a.Unmap() // judged and dialled as the IPv4 address it names
		}
		return a.String(), a, nil
	}
	if a, ok := ParseIPv4Loose(t); ok {
		return a.String(), a, nil
	}
	name := strings.ToLower(strings.TrimSuffix(t, "."))
	if !isHostname(name) {
		return "", netip.Addr{}, ErrInvalidTarget
	}
	return name, netip.Addr{}, nil
}

// isHostname is RFC 1123: dot-separated labels of letters, digits and inner hyphens,
// and not all-numeric in the last label (that would be an IP spelling).
func isHostname(s string) bool {
	if s == "" || len(s) > 253 {
		return false
	}
	labels := strings.Split(s, ".")
	for _, l := range labels {
		if l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
			return false
		}
		for i := 0; i < len(l); i++ {
			c := l[i]
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
				return false
			}
		}
	}
	last := labels[len(labels)-1]
	return strings.Trim(last, "0123456789") != ""
}

// Check decides whether target may be probed without connecting: literal addresses are
// judged directly, host names first by name (CheckName: metadata names, localhost; no
// lookup is made for those) and then on every address they resolve to. It returns the
// addresses a probe would dial.
func (p *Prober) Check(ctx context.Context, target string) (string, []netip.Addr, error) {
	canonical, ip, err := Canonical(target)
	if err != nil {
		return "", nil, err
	}
	if ip.IsValid() {
		if reason := p.Policy.Check(ip); reason != "" {
			return canonical, nil, &DeniedError{Target: target, Addr: ip, Reason: reason}
		}
		return canonical, []netip.Addr{ip}, nil
	}
	if reason := CheckName(canonical); reason != "" {
		return canonical, nil, &DeniedError{Target: target, Reason: reason}
	}
	rctx, cancel := context.WithTimeout(ctx, p.timeout())
	defer cancel()
	addrs, err := p.Resolver.LookupNetIP(rctx, "ip", canonical)
	if err != nil || len(addrs) == 0 {
		return canonical, nil, nil // nothing to dial; not a policy matter
	}
	for _, a := range addrs {
		if reason := p.Policy.Check(a); reason != "" {
			return canonical, nil, &DeniedError{Target: target, Addr: a, Reason: reason}
		}
	}
	return canonical, addrs, nil
}

// Probe checks target and, when allowed, connects to port on the first address it
// resolves to. A denied target returns a *DeniedError and makes no connection; an
// allowed one that cannot be reached is a Result with Reachable false, not an error.
func (p *Prober) Probe(ctx context.Context, target string, port uint16) (Result, error) {
	canonical, addrs, err := p.Check(ctx, target)
	if err != nil {
		return Result{}, err
	}
	res := Result{Target: canonical, At: p.Clock.Now()}
	if len(addrs) == 0 {
		res.Error = OutcomeResolveFailed
		return res, nil
	}
	res.Addr = netip.AddrPortFrom(addrs[0].WithZone(""), port)
	dctx, cancel := context.WithTimeout(ctx, p.timeout())
	defer cancel()
	start := p.Clock.Now()
	conn, err := p.Dialer.DialContext(dctx, "tcp", res.Addr.String())
	if err != nil {
		var denied *DeniedError
		if errors.As(err, &denied) {
			denied.Target = target
			return Result{}, denied
		}
		res.Error = outcome(err)
		return res, nil
	}
	res.Latency = p.Clock.Now().Sub(start)
	res.Reachable = true
	_ = conn.Close()
	return res, nil
}

func (p *Prober) timeout() time.Duration {
	if p.Timeout <= 0 {
		return DefaultTimeout
	}
	return p.Timeout
}

func outcome(err error) string {
	var ne net.Error
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return OutcomeRefused
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, os.ErrDeadlineExceeded),
		errors.As(err, &ne) && ne.Timeout():
		return OutcomeTimeout
	case errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH):
		return OutcomeUnreachable
	}
	return OutcomeFailed
}
