package gateway

import (
	"errors"
	"fmt"
	"net/url"
	"time"

	"github.com/caarlos0/env/v11"
)

// MaxBatchBytes is the hard ceiling of the size cap: 4 MiB decompressed, under Loki's own
// default limit, so a batch the gateway accepts is never refused by Loki for its size.
const MaxBatchBytes = 4 << 20

// PushPath is the only operation of the gateway.
const PushPath = "/loki/api/v1/push"

// Config is the gateway's configuration, read from the environment.
type Config struct {
	// Addr is the listen address.
	Addr string `env:"GANTRY_LOGGATEWAY_ADDR" envDefault:"127.0.0.1:3100"`
	// ControlPlaneURL is where node tokens are introspected.
	ControlPlaneURL string `env:"GANTRY_CONTROLPLANE_URL"`
	// LokiURL is Loki's base URL (the push path is appended when the URL has no path), or
	// its full push URL. Empty: batches go to FilePath (development).
	LokiURL string `env:"LOKI_URL"`
	// LokiTenant is sent as X-Scope-OrgID.
	LokiTenant string `env:"LOKI_TENANT" envDefault:"gantry"`
	// FilePath receives batches as JSON lines when LokiURL is empty.
	FilePath string `env:"GANTRY_LOGGATEWAY_FILE" envDefault:".dev/logs/nodes.log"`
	// MaxBytes caps a batch, compressed on the wire and decompressed alike.
	MaxBytes int `env:"GANTRY_LOGGATEWAY_MAX_BYTES" envDefault:"4194304"`
	// AuthCacheTTL is how long an accepted token is trusted without asking again;
	// AuthNegativeTTL how long a refused one is refused without asking again.
	AuthCacheTTL    time.Duration `env:"GANTRY_LOGGATEWAY_AUTH_CACHE_TTL" envDefault:"30s"`
	AuthNegativeTTL time.Duration `env:"GANTRY_LOGGATEWAY_AUTH_NEGATIVE_TTL" envDefault:"5s"`
	// AuthCacheSize bounds the number of cached tokens (positive and negative together).
	AuthCacheSize int `env:"GANTRY_LOGGATEWAY_AUTH_CACHE_SIZE" envDefault:"10000"`
	// IntrospectTimeout bounds one introspection call to the control plane.
	IntrospectTimeout time.Duration `env:"GANTRY_LOGGATEWAY_INTROSPECT_TIMEOUT" envDefault:"5s"`
	// ForwardTimeout bounds one push to Loki; past it the batch is forward_failed (502).
	ForwardTimeout time.Duration `env:"GANTRY_LOGGATEWAY_FORWARD_TIMEOUT" envDefault:"10s"`
	// MemoryBudget bounds the bytes of batch buffers held by requests at once; a request
	// waits for its share before it reads its body, at most QueueTimeout.
	MemoryBudget int64         `env:"GANTRY_LOGGATEWAY_MEMORY_BUDGET" envDefault:"16777216"`
	QueueTimeout time.Duration `env:"GANTRY_LOGGATEWAY_QUEUE_TIMEOUT" envDefault:"10s"`
	// LogLevel is debug, info, warn or error.
	LogLevel        string        `env:"GANTRY_LOG_LEVEL" envDefault:"info"`
	ShutdownTimeout time.Duration `env:"GANTRY_SHUTDOWN_TIMEOUT" envDefault:"15s"`
}

// DefaultConfig is the configuration with every default applied and nothing read from
// the environment.
func DefaultConfig() Config {
	cfg, err := env.ParseAsWithOptions[Config](env.Options{Environment: map[string]string{}})
	if err != nil {
		panic(err) // the defaults are constants
	}
	return cfg
}

// ConfigFromEnv reads the configuration from the environment and validates it.
func ConfigFromEnv() (Config, error) {
	cfg, err := env.ParseAs[Config]()
	if err != nil {
		return cfg, err
	}
	return cfg, cfg.Validate()
}

// Validate checks the limits of every setting.
func (c Config) Validate() error {
	var errs []error
	if c.MaxBytes < 1024 || c.MaxBytes > MaxBatchBytes {
		errs = append(errs, fmt.Errorf("GANTRY_LOGGATEWAY_MAX_BYTES must be within 1024..%d", MaxBatchBytes))
	}
	if c.ControlPlaneURL != "" {
		if err := checkURL(c.ControlPlaneURL); err != nil {
			errs = append(errs, fmt.Errorf("GANTRY_CONTROLPLANE_URL: %w", err))
		}
	}
	if c.LokiURL != "" {
		if err := checkURL(c.LokiURL); err != nil {
			errs = append(errs, fmt.Errorf("LOKI_URL: %w", err))
		}
	} else if c.FilePath == "" {
		errs = append(errs, errors.New("GANTRY_LOGGATEWAY_FILE must be set when LOKI_URL is not"))
	}
	if len(c.LokiTenant) == 0 || len(c.LokiTenant) > 150 {
		errs = append(errs, errors.New("LOKI_TENANT must be 1..150 characters"))
	}
	if c.AuthCacheTTL < 0 || c.AuthCacheTTL > 5*time.Minute {
		errs = append(errs, errors.New("GANTRY_LOGGATEWAY_AUTH_CACHE_TTL must be within 0..5m"))
	}
	if c.AuthNegativeTTL < 0 || c.AuthNegativeTTL > time.Minute {
		errs = append(errs, errors.New("GANTRY_LOGGATEWAY_AUTH_NEGATIVE_TTL must be within 0..1m"))
	}
	if c.AuthCacheSize < 1 || c.AuthCacheSize > 1_000_000 {
		errs = append(errs, errors.New("GANTRY_LOGGATEWAY_AUTH_CACHE_SIZE must be within 1..1000000"))
	}
	if c.IntrospectTimeout <= 0 || c.ForwardTimeout <= 0 || c.QueueTimeout <= 0 || c.ShutdownTimeout <= 0 {
		errs = append(errs, errors.New("timeouts must be positive"))
	}
	if c.MemoryBudget < int64(c.MaxBytes) || c.MemoryBudget > 1<<30 {
		errs = append(errs, errors.New("GANTRY_LOGGATEWAY_MEMORY_BUDGET must be within GANTRY_LOGGATEWAY_MAX_BYTES..1GiB"))
	}
	return errors.Join(errs...)
}

// MemoryLimit is the Go soft memory limit the gateway binary runs under when GOMEMLIMIT
// is not set: the batch-buffer budget plus room for the runtime, so garbage is collected
// before the resident set grows past it.
func (c Config) MemoryLimit() int64 { return max(32<<20, 2*c.MemoryBudget) }

// lokiPushURL is the URL batches are posted to.
func (c Config) lokiPushURL() string {
	u, err := url.Parse(c.LokiURL)
	if err != nil {
		return c.LokiURL
	}
	if u.Path == "" || u.Path == "/" {
		u.Path = PushPath
	}
	return u.String()
}

func checkURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return errors.New("not a URL")
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return errors.New("must be an http(s) URL with a host")
	}
	return nil
}
