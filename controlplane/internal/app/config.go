package app

import (
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/caarlos0/env/v11"

	"github.com/gantry-gpu/gantry/controlplane/internal/auth"
	"github.com/gantry-gpu/gantry/controlplane/internal/ratelimit"
)

// Config is the control plane's configuration, read from the environment. Every field
// has a default that works for `make dev`; README lists them.
type Config struct {
	HTTPAddr    string `env:"GANTRY_HTTP_ADDR" envDefault:"127.0.0.1:8080"`
	DatabaseURL string `env:"DATABASE_URL"`
	NATSURL     string `env:"NATS_URL"`
	// RedisURL, when set, makes rate-limit counters shared across replicas.
	RedisURL string `env:"REDIS_URL"`
	LogLevel string `env:"GANTRY_LOG_LEVEL" envDefault:"info"`
	// MaxBodyBytes caps every request body.
	MaxBodyBytes int64 `env:"GANTRY_MAX_BODY_BYTES" envDefault:"1048576"`
	// RateLimits overrides per-group limits, e.g. "auth=60,admin=600,api=1200,internal=60".
	RateLimits string `env:"GANTRY_RATE_LIMITS"`
	// IdempotencyRetention is how long Idempotency-Key results are kept (at least 24h).
	IdempotencyRetention time.Duration `env:"GANTRY_IDEMPOTENCY_RETENTION" envDefault:"24h"`
	// CursorKey signs pagination cursors; derived from the master key when empty.
	CursorKey string `env:"GANTRY_CURSOR_KEY"`
	// EventsStream and EventsSubjectPrefix name where the outbox relay publishes.
	EventsStream        string `env:"GANTRY_EVENTS_STREAM" envDefault:"GANTRY_EVENTS"`
	EventsSubjectPrefix string `env:"GANTRY_EVENTS_SUBJECT_PREFIX" envDefault:"gantry.events."`
	// ShutdownTimeout bounds the graceful drain on SIGTERM / Ctrl-C.
	ShutdownTimeout time.Duration `env:"GANTRY_SHUTDOWN_TIMEOUT" envDefault:"15s"`

	Auth auth.Config
}

// LoadConfig reads the environment. dev relaxes the master-key requirement.
func LoadConfig(dev bool) (Config, error) {
	cfg, err := env.ParseAs[Config]()
	if err != nil {
		return Config{}, fmt.Errorf("config: %w", err)
	}
	if cfg.Auth, err = auth.LoadConfig(dev); err != nil {
		return Config{}, err
	}
	if _, err := cfg.RateLimitGroups(); err != nil {
		return Config{}, err
	}
	return cfg, nil
}

// RateLimitGroups applies GANTRY_RATE_LIMITS over the default groups.
func (c Config) RateLimitGroups() ([]ratelimit.Group, error) {
	groups := ratelimit.DefaultGroups()
	if strings.TrimSpace(c.RateLimits) == "" {
		return groups, nil
	}
	for _, part := range strings.Split(c.RateLimits, ",") {
		name, val, ok := strings.Cut(strings.TrimSpace(part), "=")
		n, err := strconv.Atoi(val)
		if !ok || err != nil || n < 0 {
			return nil, fmt.Errorf("GANTRY_RATE_LIMITS: %q is not group=requests_per_minute", part)
		}
		found := false
		for i := range groups {
			if groups[i].Name == name {
				groups[i].PerMinute, found = n, true
			}
		}
		if !found {
			return nil, fmt.Errorf("GANTRY_RATE_LIMITS: unknown group %q", name)
		}
	}
	return groups, nil
}

// Level is the slog level of LogLevel.
func (c Config) Level() slog.Level {
	var l slog.Level
	if err := l.UnmarshalText([]byte(c.LogLevel)); err != nil {
		return slog.LevelInfo
	}
	return l
}
