package storage

import "time"

// Defaults of Config.
const (
	DefaultQuotaBytes     = 100 << 30 // 100 GiB per project
	DefaultQuotaObjects   = 1_000_000
	DefaultMaxObjectBytes = 5 << 30 // 5 GiB per PUT
	DefaultUploadTTL      = time.Hour
	DefaultSweepInterval  = 5 * time.Second
	DefaultSweepBatch     = 500
)

// Config is GANTRY_STORAGE_* (docs/storage.md).
type Config struct {
	// DefaultQuotaBytes and DefaultQuotaObjects are every project's limits unless its
	// tenant has its own (PUT /api/v1/admin/tenants/{tenant_id}/storage-quota).
	DefaultQuotaBytes   int64 `env:"GANTRY_STORAGE_DEFAULT_QUOTA_BYTES" envDefault:"107374182400"`
	DefaultQuotaObjects int64 `env:"GANTRY_STORAGE_DEFAULT_QUOTA_OBJECTS" envDefault:"1000000"`
	// MaxObjectBytes bounds one PUT (413 above it).
	MaxObjectBytes int64 `env:"GANTRY_STORAGE_MAX_OBJECT_BYTES" envDefault:"5368709120"`
	// UploadTTL is how long a reservation may stay open without growing before the
	// sweeper treats its upload as crashed and frees it (Grow extends it).
	UploadTTL time.Duration `env:"GANTRY_STORAGE_UPLOAD_TTL" envDefault:"1h"`
	// SweepInterval is how often expired uploads, the blob garbage queue and buckets
	// being force-deleted are worked on (negative: never); SweepBatch bounds one step
	// of each.
	SweepInterval time.Duration `env:"GANTRY_STORAGE_SWEEP_INTERVAL" envDefault:"5s"`
	SweepBatch    int           `env:"GANTRY_STORAGE_SWEEP_BATCH" envDefault:"500"`
}

func (c Config) withDefaults() Config {
	if c.DefaultQuotaBytes <= 0 {
		c.DefaultQuotaBytes = DefaultQuotaBytes
	}
	if c.DefaultQuotaObjects <= 0 {
		c.DefaultQuotaObjects = DefaultQuotaObjects
	}
	if c.MaxObjectBytes <= 0 {
		c.MaxObjectBytes = DefaultMaxObjectBytes
	}
	if c.UploadTTL <= 0 {
		c.UploadTTL = DefaultUploadTTL
	}
	if c.SweepInterval == 0 { // negative: no sweeper (tests sweep by hand)
		c.SweepInterval = DefaultSweepInterval
	}
	if c.SweepBatch <= 0 {
		c.SweepBatch = DefaultSweepBatch
	}
	return c
}
