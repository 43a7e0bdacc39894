package terminal

import (
	"errors"
	"fmt"
	"time"

	"github.com/gantry-gpu/gantry/shared/termproto"
)

// Config is GANTRY_TERMINAL_*. Zero values in a Config built by hand (tests, benchmarks)
// take the defaults below; the env defaults say the same.
type Config struct {
	// AllowedOrigins are the browser origins, besides this host itself, that may open a
	// terminal: host patterns ("console.example.com", "*.example.com") or scheme://host
	// patterns, matched with path.Match. Empty: same host only.
	AllowedOrigins []string `env:"GANTRY_TERMINAL_ALLOWED_ORIGINS" envSeparator:","`
	// TokenTTL is how long a minted token may wait for its WebSocket (seed: short-lived).
	TokenTTL time.Duration `env:"GANTRY_TERMINAL_TOKEN_TTL" envDefault:"60s"`
	// DetachGrace is how long a session nobody is attached to is kept for a reattach;
	// it must match the agent's (GANTRY_NODEAGENT_TERMINAL_DETACHED_TIMEOUT) so that the
	// audit's idle_timeout end is when the agent ended the PTY.
	DetachGrace time.Duration `env:"GANTRY_TERMINAL_DETACH_GRACE" envDefault:"5m"`
	// PingInterval is how often the server pings the browser so load balancers keep an
	// idle terminal open; a ping unanswered within the interval closes (detaches) it.
	PingInterval time.Duration `env:"GANTRY_TERMINAL_PING_INTERVAL" envDefault:"15s"`
	// WriteTimeout bounds one write of output to the browser. A browser that reads
	// nothing for this long is detached (the session and its replay buffer survive on
	// the node) instead of having output queued for it without bound.
	WriteTimeout time.Duration `env:"GANTRY_TERMINAL_WRITE_TIMEOUT" envDefault:"10s"`
	// OpenTimeout bounds opening the stream to the agent (and the hop to the replica
	// holding the node's tunnel) before the WebSocket upgrade.
	OpenTimeout time.Duration `env:"GANTRY_TERMINAL_OPEN_TIMEOUT" envDefault:"15s"`
	// InternalURL is the base URL other control-plane replicas use to reach this one
	// for the terminal relay ("http://10.0.0.5:8080"); default: http:// + the HTTP
	// listen address.
	InternalURL string `env:"GANTRY_TERMINAL_INTERNAL_URL"`
	// ReplicaBucket is the JetStream KV bucket where replicas publish InternalURL;
	// empty in a hand-built Config: "<events stream>_TERMINAL_REPLICAS".
	ReplicaBucket string `env:"GANTRY_TERMINAL_REPLICA_BUCKET" envDefault:"gantry_terminal_replicas"`
	// OutputWindow is how many bytes of a terminal's output the agent may have sent and
	// the browser not yet been handed (the terminal's own flow control, shared/termproto
	// flow.go): it bounds what a terminal printing at full speed puts in flight on the
	// node's tunnel, ahead of other sessions' keystroke echo. 32 KiB..16 MiB; -1 turns the
	// terminal's flow control off (the tunnel's windows alone, as agents without it).
	OutputWindow int `env:"GANTRY_TERMINAL_OUTPUT_WINDOW" envDefault:"65536"`
}

// Defaults.
const (
	DefaultTokenTTL     = 60 * time.Second
	DefaultDetachGrace  = 5 * time.Minute
	DefaultPingInterval = 15 * time.Second
	DefaultWriteTimeout = 10 * time.Second
	DefaultOpenTimeout  = 15 * time.Second
	// DefaultOutputWindow: 64 KiB in flight keeps a browser terminal fed (about 500 MB/s
	// at a 0.1 ms round trip, 1.3 MB/s at 50 ms, more than a browser renders) while a
	// flood on the same tunnel adds about a millisecond to other sessions' echo
	// (docs/terminal.md).
	DefaultOutputWindow = 64 << 10
)

func (c *Config) setDefaults() error {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&c.TokenTTL, DefaultTokenTTL)
	def(&c.DetachGrace, DefaultDetachGrace)
	def(&c.PingInterval, DefaultPingInterval)
	def(&c.WriteTimeout, DefaultWriteTimeout)
	def(&c.OpenTimeout, DefaultOpenTimeout)
	switch {
	case c.OutputWindow == 0:
		c.OutputWindow = DefaultOutputWindow
	case c.OutputWindow < 0:
		c.OutputWindow = -1
	case !termproto.ValidWindow(c.OutputWindow):
		return fmt.Errorf("terminal: GANTRY_TERMINAL_OUTPUT_WINDOW must be %d..%d bytes, or -1 for off", termproto.MinWindow, termproto.MaxWindow)
	}
	if c.ReplicaBucket == "" {
		return errors.New("terminal: ReplicaBucket is required")
	}
	for _, p := range c.AllowedOrigins {
		if p == "*" {
			return errors.New("terminal: GANTRY_TERMINAL_ALLOWED_ORIGINS may not be \"*\": list the origins")
		}
	}
	return nil
}
