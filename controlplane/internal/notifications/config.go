package notifications

import (
	"fmt"
	"path"
	"strings"
	"time"

	"github.com/caarlos0/env/v11"
)

// Config is GANTRY_NOTIFICATIONS_* (docs/notifications.md). Zero fields take the defaults.
type Config struct {
	// AllowedOrigins are the browser origins allowed besides the request's own host:
	// host patterns ("app.example.com", "*.example.com") or "scheme://host" patterns,
	// matched case-insensitively with path.Match. Empty: same host only.
	AllowedOrigins []string `env:"GANTRY_NOTIFICATIONS_ALLOWED_ORIGINS" envSeparator:","`
	// MaxConnectionsPerUser caps one user's open connections on one replica.
	MaxConnectionsPerUser int `env:"GANTRY_NOTIFICATIONS_MAX_CONNECTIONS_PER_USER" envDefault:"10"`
	// SendQueue is how many messages may wait for one connection; a client that lets
	// more pile up is disconnected (1008) and told to resync.
	SendQueue int `env:"GANTRY_NOTIFICATIONS_SEND_QUEUE" envDefault:"64"`
	// PingInterval is how often the server pings, so load balancers keep idle sockets.
	PingInterval time.Duration `env:"GANTRY_NOTIFICATIONS_PING_INTERVAL" envDefault:"15s"`
	// WriteTimeout bounds one message write and one ping round trip.
	WriteTimeout time.Duration `env:"GANTRY_NOTIFICATIONS_WRITE_TIMEOUT" envDefault:"10s"`
}

// Defaults of the fields a hand-built Config leaves zero.
const (
	DefaultMaxConnectionsPerUser = 10
	DefaultSendQueue             = 64
	DefaultPingInterval          = 15 * time.Second
	DefaultWriteTimeout          = 10 * time.Second
	// accessTTL is how long a connection trusts a project-visibility answer (the seed's
	// 60-second policy cache): a member removed from a project stops getting its messages
	// within it.
	accessTTL = 60 * time.Second
	// maxClientMessage caps what a client may send: clients send nothing but pings.
	maxClientMessage = 1 << 10
)

// LoadConfig reads GANTRY_NOTIFICATIONS_* from the environment.
func LoadConfig() (Config, error) {
	c, err := env.ParseAs[Config]()
	if err != nil {
		return Config{}, fmt.Errorf("config: %w", err)
	}
	return c.withDefaults()
}

// withDefaults fills zero fields and checks the rest.
func (c Config) withDefaults() (Config, error) {
	if c.MaxConnectionsPerUser == 0 {
		c.MaxConnectionsPerUser = DefaultMaxConnectionsPerUser
	}
	if c.SendQueue == 0 {
		c.SendQueue = DefaultSendQueue
	}
	if c.PingInterval == 0 {
		c.PingInterval = DefaultPingInterval
	}
	if c.WriteTimeout == 0 {
		c.WriteTimeout = DefaultWriteTimeout
	}
	if c.MaxConnectionsPerUser < 0 || c.SendQueue < 0 || c.PingInterval < 0 || c.WriteTimeout < 0 {
		return Config{}, fmt.Errorf("GANTRY_NOTIFICATIONS_*: limits must be positive")
	}
	origins := c.AllowedOrigins[:0:0]
	for _, o := range c.AllowedOrigins {
		o = strings.ToLower(strings.TrimSpace(o))
		if o == "" {
			continue
		}
		if _, err := path.Match(o, ""); err != nil {
			return Config{}, fmt.Errorf("GANTRY_NOTIFICATIONS_ALLOWED_ORIGINS: bad pattern %q", o)
		}
		origins = append(origins, o)
	}
	c.AllowedOrigins = origins
	return c, nil
}
