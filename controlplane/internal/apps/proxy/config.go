package proxy

import (
	"errors"
	"time"
)

// Config is GANTRY_APP_PROXY_*. Zero values in a Config built by hand take the defaults.
type Config struct {
	// ExchangeTTL is how long a minted exchange code may wait for its one use.
	ExchangeTTL time.Duration `env:"GANTRY_APP_PROXY_EXCHANGE_TTL" envDefault:"60s"`
	// CookieTTL is the life of the instance cookie an exchange sets; after it the browser
	// goes through the exchange again. Access is re-checked on every request anyway.
	CookieTTL time.Duration `env:"GANTRY_APP_PROXY_COOKIE_TTL" envDefault:"8h"`
	// OpenTimeout bounds opening a stream to the app (and the hop to the replica holding
	// the node's tunnel).
	OpenTimeout time.Duration `env:"GANTRY_APP_PROXY_OPEN_TIMEOUT" envDefault:"15s"`
	// ResponseHeaderTimeout bounds the wait for the app's response head once the request
	// is sent (a hung app is a 502, not a hang).
	ResponseHeaderTimeout time.Duration `env:"GANTRY_APP_PROXY_RESPONSE_HEADER_TIMEOUT" envDefault:"60s"`
	// MaxIdlePerInstance is how many idle kept-alive connections (fabric streams) to one
	// instance this replica keeps for the next requests.
	MaxIdlePerInstance int `env:"GANTRY_APP_PROXY_MAX_IDLE_PER_INSTANCE" envDefault:"16"`
	// AccessCacheTTL is how long a caller's admission to an instance (and where the
	// instance is served) is reused before it is read again; negative reads both on
	// every request (cache.go says what the TTL costs).
	AccessCacheTTL time.Duration `env:"GANTRY_APP_PROXY_ACCESS_CACHE_TTL" envDefault:"1s"`
	// CodeBucket is the JetStream KV bucket of exchange codes (shared by the replicas);
	// empty in a hand-built Config: "gantry_app_proxy_codes".
	CodeBucket string `env:"GANTRY_APP_PROXY_CODE_BUCKET" envDefault:"gantry_app_proxy_codes"`
}

// Defaults.
const (
	DefaultExchangeTTL           = 60 * time.Second
	DefaultCookieTTL             = 8 * time.Hour
	DefaultOpenTimeout           = 15 * time.Second
	DefaultResponseHeaderTimeout = 60 * time.Second
	DefaultMaxIdlePerInstance    = 16
	DefaultCodeBucket            = "gantry_app_proxy_codes"
	DefaultAccessCacheTTL        = time.Second
)

func (c *Config) setDefaults() error {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&c.ExchangeTTL, DefaultExchangeTTL)
	def(&c.CookieTTL, DefaultCookieTTL)
	def(&c.OpenTimeout, DefaultOpenTimeout)
	def(&c.ResponseHeaderTimeout, DefaultResponseHeaderTimeout)
	switch {
	case c.AccessCacheTTL == 0:
		c.AccessCacheTTL = DefaultAccessCacheTTL
	case c.AccessCacheTTL < 0:
		c.AccessCacheTTL = 0 // off
	}
	if c.MaxIdlePerInstance <= 0 {
		c.MaxIdlePerInstance = DefaultMaxIdlePerInstance
	}
	if c.CodeBucket == "" {
		c.CodeBucket = DefaultCodeBucket
	}
	if c.ExchangeTTL > 10*time.Minute {
		return errors.New("app proxy: GANTRY_APP_PROXY_EXCHANGE_TTL must be at most 10m (a code is short-lived)")
	}
	return nil
}
