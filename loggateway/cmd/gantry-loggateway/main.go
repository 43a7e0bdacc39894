// Command gantry-loggateway is the node log gateway (ARCHITECTURE §6): node agents push
// Loki batches to it with their node bearer token; it checks size and token, stamps the
// authenticated node_id and forwards to Loki (LOKI_URL), or to a local JSON-lines file
// when LOKI_URL is unset. Configuration is the environment (see docs/loggateway.md).
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"

	"github.com/gantry-gpu/gantry/loggateway/gateway"
	"github.com/gantry-gpu/gantry/shared/clock"
	"github.com/gantry-gpu/gantry/shared/obs"
)

// version is set at build time: -ldflags "-X main.version=1.2.3".
var version = "dev"

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "gantry-loggateway:", err)
		os.Exit(1)
	}
}

func run() error {
	cfg, err := gateway.ConfigFromEnv()
	if err != nil {
		return err
	}
	if cfg.ControlPlaneURL == "" {
		return errors.New("GANTRY_CONTROLPLANE_URL is required: node tokens are checked there")
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(cfg.LogLevel)); err != nil {
		return fmt.Errorf("GANTRY_LOG_LEVEL: %w", err)
	}
	log := obs.NewLogger(os.Stderr, gateway.Service, level)
	if os.Getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(cfg.MemoryLimit())
	}

	g, err := gateway.New(cfg, gateway.Options{
		Introspector: gateway.NewControlPlane(cfg.ControlPlaneURL, cfg.IntrospectTimeout),
		Clock:        clock.Real{},
		Logger:       log,
		Version:      version,
	})
	if err != nil {
		return err
	}
	defer func() { _ = g.Close() }()

	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return err
	}
	dest := "loki " + redact(cfg.LokiURL)
	if cfg.LokiURL == "" {
		dest = "file " + cfg.FilePath
	}
	log.Info("log gateway listening", "addr", ln.Addr().String(), "forward_to", dest, "max_bytes", cfg.MaxBytes)
	if cfg.LokiURL == "" {
		log.Warn("LOKI_URL is not set: node logs go to a local file (development only)", "file", cfg.FilePath)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := g.Serve(ctx, ln); err != nil {
		return err
	}
	log.Info("log gateway stopped")
	return nil
}

// redact hides credentials a URL may carry, for logging.
func redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparseable URL)"
	}
	return u.Redacted()
}
