package blob

import (
	"fmt"

	"github.com/caarlos0/env/v11"
)

// Config is GANTRY_STORAGE_DRIVER and the chosen driver's settings (docs/storage.md).
type Config struct {
	// Driver is "fs" (the embedded default: one control-plane host) or "s3" (any
	// S3-compatible server: the answer for more than one control-plane host).
	Driver string `env:"GANTRY_STORAGE_DRIVER" envDefault:"fs"`
	// FSRoot is the fs driver's directory, created when missing.
	FSRoot string `env:"GANTRY_STORAGE_FS_ROOT" envDefault:".dev/storage"`
	S3     S3Config
}

// S3Config is GANTRY_STORAGE_S3_*.
type S3Config struct {
	// Endpoint is "host:port" or "https://host[:port]" / "http://host[:port]".
	Endpoint string `env:"GANTRY_STORAGE_S3_ENDPOINT"`
	// Bucket must exist; the driver does not create it.
	Bucket    string `env:"GANTRY_STORAGE_S3_BUCKET"`
	AccessKey string `env:"GANTRY_STORAGE_S3_ACCESS_KEY"`
	SecretKey string `env:"GANTRY_STORAGE_S3_SECRET_KEY"`
	// Region is sent in signatures; empty lets the client ask the server.
	Region string `env:"GANTRY_STORAGE_S3_REGION"`
	// Insecure talks plain HTTP to a host:port endpoint (a server on a private network
	// or in tests). There is deliberately no switch to skip TLS verification.
	Insecure bool `env:"GANTRY_STORAGE_S3_INSECURE"`
}

// LoadConfig reads GANTRY_STORAGE_DRIVER, GANTRY_STORAGE_FS_ROOT and GANTRY_STORAGE_S3_*.
func LoadConfig() (Config, error) {
	c, err := env.ParseAs[Config]()
	if err != nil {
		return Config{}, fmt.Errorf("config: %w", err)
	}
	return c, nil
}

// Open builds the driver cfg.Driver names (empty means fs).
func Open(cfg Config) (Driver, error) {
	switch cfg.Driver {
	case "", "fs":
		root := cfg.FSRoot
		if root == "" {
			root = ".dev/storage"
		}
		return NewFS(root)
	case "s3":
		return NewS3(cfg.S3)
	default:
		return nil, fmt.Errorf("blob: GANTRY_STORAGE_DRIVER=%q: want fs or s3", cfg.Driver)
	}
}
