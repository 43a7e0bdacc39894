package agent

import (
	"context"
	"fmt"
	"log/slog"
	"os"

	"github.com/gantry-gpu/gantry/nodeagent/config"
	"github.com/gantry-gpu/gantry/nodeagent/gpu"
	"github.com/gantry-gpu/gantry/shared/fabricnet"
)

// OptionsFromConfig maps an enrolled configuration onto Options (address, transport,
// TLS trust, token file, hostname, telemetry interval). The caller adds the GPU backend,
// the executor and the logger. `gantry-nodeagent run` and the end-to-end tests both
// build their agent through it.
func OptionsFromConfig(cfg config.Config, agentVersion string) (Options, error) {
	if err := cfg.Validate(); err != nil {
		return Options{}, err
	}
	mode, err := fabricnet.ParseMode(cfg.Transport)
	if err != nil {
		return Options{}, err
	}
	tlsConf, err := cfg.TLSConfig()
	if err != nil {
		return Options{}, err
	}
	// Fail fast on an unreadable token (missing, readable by others) rather than
	// retrying forever; later connects read the file again, so a rotated token is used.
	if _, err := cfg.ReadToken(); err != nil {
		return Options{}, err
	}
	host := cfg.Hostname
	if host == "" {
		if h, err := os.Hostname(); err == nil && h != "" {
			host = h
		} else {
			host = "unknown"
		}
	}
	return Options{
		Addr:              cfg.FabricAddr,
		Transport:         mode,
		TLS:               tlsConf,
		Token:             cfg.ReadToken,
		AgentVersion:      agentVersion,
		Hostname:          host,
		TelemetryInterval: cfg.TelemetryInterval,
	}, nil
}

// RunConfig is `gantry-nodeagent run` as a function: it opens the configured GPU backend
// (mock backends seeded with the node id, so GPU UUIDs are stable per node), builds the
// agent from cfg and runs it until ctx ends. `make dev` can run an enrolled agent
// in-process through it.
func RunConfig(ctx context.Context, cfg config.Config, agentVersion string, log *slog.Logger) error {
	opts, err := OptionsFromConfig(cfg, agentVersion)
	if err != nil {
		return err
	}
	backend, err := gpu.Open(cfg.GPUBackend, gpu.Options{MockSeed: cfg.NodeID})
	if err != nil {
		return fmt.Errorf("gpu backend %s: %w", cfg.GPUBackend, err)
	}
	defer backend.Close()
	opts.GPU, opts.Logger = backend, log
	a, err := New(opts)
	if err != nil {
		return err
	}
	log.Info("agent starting", "node_id", cfg.NodeID, "fabric", cfg.FabricAddr, "transport", opts.Transport, "gpu_backend", backend.Name())
	return a.Run(ctx)
}
