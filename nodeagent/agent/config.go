package agent

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/gantry-gpu/gantry/nodeagent/apps"
	"github.com/gantry-gpu/gantry/nodeagent/config"
	"github.com/gantry-gpu/gantry/nodeagent/gpu"
	"github.com/gantry-gpu/gantry/nodeagent/logship"
	"github.com/gantry-gpu/gantry/nodeagent/runtime"
	"github.com/gantry-gpu/gantry/nodeagent/sshserver"
	"github.com/gantry-gpu/gantry/nodeagent/storagemount"
	"github.com/gantry-gpu/gantry/nodeagent/terminal"
	"github.com/gantry-gpu/gantry/shared/fabricnet"
	"github.com/gantry-gpu/gantry/shared/obs"
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
		AgentCommit:       BuildCommit(),
		Hostname:          host,
		TelemetryInterval: cfg.TelemetryInterval,
	}, nil
}

// BuildCommit is the VCS revision the binary was built from (Go's build info; "" when
// built without VCS stamping), for the build info metric.
func BuildCommit() string { return obs.ReadBuild("").Commit }

// RunConfig is `gantry-nodeagent run` as a function: it opens the configured GPU backend
// (mock backends seeded with the node id, so GPU UUIDs are stable per node), runs the
// allocation task kinds through the configured runtime (nodeagent/runtime), starts the
// log shipper when a log gateway is configured (the agent's own log records then go to
// both log and the gateway), builds the agent from cfg and runs it until ctx ends.
// `make dev` can run an enrolled agent in-process through it.
func RunConfig(ctx context.Context, cfg config.Config, agentVersion string, log *slog.Logger) error {
	opts, err := OptionsFromConfig(cfg, agentVersion)
	if err != nil {
		return err
	}
	if cfg.LogGatewayURL != "" {
		var level slog.Level
		_ = level.UnmarshalText([]byte(cfg.LogLevel))
		shipper, err := logship.New(logship.Config{
			GatewayURL: cfg.LogGatewayURL,
			Token: func() string {
				t, _ := cfg.ReadToken()
				return t
			},
			Labels:   map[string]string{"job": "gantry-nodeagent", "hostname": opts.Hostname},
			SpoolDir: cfg.LogSpoolDir,
			Logger:   log,
		})
		if err != nil {
			return fmt.Errorf("log shipper: %w", err)
		}
		// The shipper outlives the agent by a moment so the last records (the shutdown)
		// are sealed into the spool, then flushed on the next start if not delivered.
		shipCtx, stopShip := context.WithCancel(context.WithoutCancel(ctx))
		shipped := make(chan struct{})
		go func() { defer close(shipped); _ = shipper.Run(shipCtx) }()
		defer func() {
			stopShip()
			select {
			case <-shipped:
			case <-time.After(5 * time.Second):
			}
		}()
		opts.LogStats = shipper.Stats
		log = slog.New(slog.NewMultiHandler(log.Handler(), shipper.SlogHandler(&slog.HandlerOptions{Level: level})))
	}
	backend, err := gpu.Open(cfg.GPUBackend, gpu.Options{MockSeed: cfg.NodeID})
	if err != nil {
		return fmt.Errorf("gpu backend %s: %w", cfg.GPUBackend, err)
	}
	defer backend.Close()
	rt, err := runtime.FromConfig(cfg, backend, log)
	if err != nil {
		return fmt.Errorf("allocation runtime: %w", err)
	}
	mux := rt.Mux()
	opts.GPU, opts.Logger, opts.Executor = backend, log, mux
	// Results wait for the control plane's acknowledgement beside the runtime's records,
	// and every Hello reports what the runtime holds.
	opts.StateDir = runtime.StateDir(cfg)
	// Buckets attached into allocations (storage.attach / storage.detach); their bytes
	// travel over the current tunnel's StorageFabric, and a release detaches them first.
	conns := storagemount.NewConns()
	opts.OnTunnel = conns.SetTunnel
	storage, err := storagemount.New(storagemount.Options{
		StateDir: opts.StateDir, Client: storagemount.NewClient(conns), Accounts: rt,
		Mode: cfg.StorageMode, SyncInterval: cfg.StorageSyncInterval, Logger: log,
	})
	if err != nil {
		return fmt.Errorf("storage attachments: %w", err)
	}
	storage.Register(mux, rt)
	// On shutdown the storage manager goes first: it uploads what rw copies still hold
	// while the tunnel is up, ends the mounts (their records stay for the next start),
	// and only then stops the agent (agentCtx).
	agentCtx, stopAgent := context.WithCancel(context.WithoutCancel(ctx))
	defer stopAgent()
	storageCtx, stopStorage := context.WithCancel(ctx)
	storageDone := make(chan struct{})
	go func() {
		defer close(storageDone)
		defer stopAgent()
		// Mounts the node held before a restart come back (FUSE needs no tunnel to
		// mount; reads wait for one).
		for _, g := range storage.Restore(storageCtx) {
			log.Warn("storage attachment not restored", "attachment_id", g.AttachmentID, "allocation_id", g.AllocationID, "reason", g.Reason)
		}
		storage.Run(storageCtx)
	}()
	defer func() { stopStorage(); <-storageDone }()
	opts.Workloads = rt.Held
	// Browser terminals (nodeagent/terminal) in the runtime's live allocations; every
	// session is ended (Run's Close) before RunConfig returns.
	term := terminal.New(terminal.RuntimeEnvironments(rt), terminal.Options{DetachedTimeout: cfg.TerminalDetachedTimeout, Logger: log})
	// SSH through the tunnel (nodeagent/sshserver): the host's sshd for linux-user
	// allocations, the agent's own SSH server for the process runtime, whose host key
	// lives in the state directory so known_hosts entries survive restarts.
	hostKey, err := sshserver.LoadOrCreateHostKey(filepath.Join(opts.StateDir, "ssh_host_ed25519_key"))
	if err != nil {
		return fmt.Errorf("ssh host key: %w", err)
	}
	sshSrv, err := sshserver.New(sshserver.RuntimeEnvironments(rt), sshserver.Options{HostKey: hostKey, Logger: log})
	if err != nil {
		return err
	}
	defer sshSrv.Close()
	// App instances (nodeagent/apps): app.start/app.stop run the apps' processes inside
	// the allocations; their records under the state directory let the next agent adopt
	// the processes a restart leaves running, and their reports go to the control plane.
	appSup, err := apps.New(apps.Options{Envs: rt, StateDir: opts.StateDir, Logger: log,
		// Artifacts come from the control plane over the current tunnel.
		Artifacts: apps.FabricArtifacts{Conn: conns.Wait}})
	if err != nil {
		return err
	}
	appSup.Register(mux)
	appsCtx, stopApps := context.WithCancel(ctx)
	if err := appSup.Restore(appsCtx); err != nil {
		stopApps()
		return fmt.Errorf("app instances: %w", err)
	}
	defer func() { stopApps(); appSup.Wait() }()
	opts.Reports = appSup
	// Stop and release end the allocation's terminal sessions with an exit frame first,
	// its SSH connections, and its app instances (stopped, not restarted).
	rt.NotifyInactive(func(id, _ string) { term.EndAllocation(id); sshSrv.EndAllocation(id); appSup.EndAllocation(id) })
	termCtx, stopTerm := context.WithCancel(ctx)
	termDone := make(chan struct{})
	go func() { defer close(termDone); _ = term.Run(termCtx) }()
	defer func() { stopTerm(); <-termDone }()
	opts.Streams = apps.Streams{Apps: appSup, Other: sshserver.Streams{SSH: sshSrv, Other: term}}
	a, err := New(opts)
	if err != nil {
		return err
	}
	log.Info("agent starting", "node_id", cfg.NodeID, "fabric", cfg.FabricAddr, "transport", opts.Transport, "gpu_backend", backend.Name(), "runtime", rt.Name())
	return a.Run(agentCtx)
}
