package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/gantry-gpu/gantry/nodeagent/agent"
	"github.com/gantry-gpu/gantry/nodeagent/config"
	"github.com/gantry-gpu/gantry/nodeagent/enroll"
	"github.com/gantry-gpu/gantry/nodeagent/gpu"
	"github.com/gantry-gpu/gantry/shared/fabricnet"
	"github.com/spf13/cobra"
)

// EnvEnrollmentToken lets the install script pass the one-time token without putting it
// on a command line (visible in ps).
const EnvEnrollmentToken = config.EnvPrefix + "ENROLLMENT_TOKEN"

type globals struct {
	configPath string
	transport  string
	gpuBackend string
	runtime    string
}

func newRoot() *cobra.Command {
	g := &globals{}
	root := &cobra.Command{
		Use:           "gantry-nodeagent",
		Short:         "Gantry node agent: GPU inventory, telemetry and tasks over one outbound tunnel",
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       version,
	}
	defPath := config.DefaultPath
	if p := os.Getenv(config.EnvConfigPath); p != "" {
		defPath = p
	}
	root.PersistentFlags().StringVar(&g.configPath, "config", defPath, "configuration file (env "+config.EnvConfigPath+")")
	root.AddCommand(enrollCmd(g), runCmd(g), gpuCmd(g))
	return root
}

// load reads the config file and environment, then applies flags given on the command
// line (flags win over env, env over the file).
func (g *globals) load(cmd *cobra.Command, missingOK bool) (config.Config, error) {
	cfg, err := config.Load(g.configPath, missingOK, os.LookupEnv)
	if errors.Is(err, os.ErrNotExist) {
		return cfg, fmt.Errorf("%s not found: enroll this host first (gantry-nodeagent enroll --server URL --token TOKEN)", g.configPath)
	}
	if err != nil {
		return cfg, err
	}
	if cfg.Path == "" {
		cfg.Path = g.configPath
	}
	if f := cmd.Flags().Lookup("transport"); f != nil && f.Changed {
		cfg.Transport = g.transport
	}
	if f := cmd.Flags().Lookup("gpu-backend"); f != nil && f.Changed {
		cfg.GPUBackend = g.gpuBackend
	}
	if f := cmd.Flags().Lookup("runtime"); f != nil && f.Changed {
		cfg.Runtime = g.runtime
	}
	return cfg, nil
}

func addBackendFlag(cmd *cobra.Command, g *globals) {
	cmd.Flags().StringVar(&g.gpuBackend, "gpu-backend", "nvml", "GPU backend: "+strings.Join(gpu.Names(), ", "))
}

func addTransportFlag(cmd *cobra.Command, g *globals) {
	cmd.Flags().StringVar(&g.transport, "transport", "auto", "fabric transport: auto (QUIC, falling back to TLS+TCP), quic or tcp")
}

func newLogger(level string) *slog.Logger {
	var l slog.Level
	_ = l.UnmarshalText([]byte(level))
	return slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: l})).With("service", "gantry-nodeagent", "version", version)
}

func hostname(cfg config.Config) string {
	if cfg.Hostname != "" {
		return cfg.Hostname
	}
	h, err := os.Hostname()
	if err != nil || h == "" {
		return "unknown"
	}
	return h
}

// ---------------------------------------------------------------------------------------

func enrollCmd(g *globals) *cobra.Command {
	var server, token, host, serverCA, logGateway string
	cmd := &cobra.Command{
		Use:   "enroll",
		Short: "Trade a one-time enrollment token for this node's credentials and write the configuration",
		Long: `enroll calls POST /api/v1/internal/nodes/enroll on the control plane and writes:
  the config file (--config), the node token (token_file, mode 0600) and the fabric CA
  (ca_file). Running it again with a new enrollment token re-enrolls the host; the
  control plane then revokes the previous token.`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if token == "" {
				token = os.Getenv(EnvEnrollmentToken)
			}
			if server == "" || token == "" {
				return errors.New("--server and --token (or " + EnvEnrollmentToken + ") are required")
			}
			cfg, err := g.load(cmd, true)
			if err != nil {
				return err
			}
			if host != "" {
				cfg.Hostname = host
			}
			if logGateway != "" {
				cfg.LogGatewayURL = logGateway
			}
			if _, err := fabricnet.ParseMode(cfg.Transport); err != nil {
				return err
			}
			hc, err := httpClient(serverCA)
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), time.Minute)
			defer cancel()
			res, err := enroll.Call(ctx, hc, server, enroll.Request{EnrollmentToken: token, Hostname: hostname(cfg), AgentVersion: version})
			if err != nil {
				return err
			}
			cfg, err = enroll.Apply(cfg, server, res)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "enrolled node %s; fabric %s; config %s\n", res.NodeID, res.FabricAddr, cfg.Path)
			return nil
		},
	}
	cmd.Flags().StringVar(&server, "server", "", "control plane URL, e.g. https://cp.example")
	cmd.Flags().StringVar(&token, "token", "", "one-time enrollment token (or env "+EnvEnrollmentToken+")")
	cmd.Flags().StringVar(&host, "hostname", "", "hostname to report (default: the system's; stored in the config)")
	cmd.Flags().StringVar(&logGateway, "log-gateway", "", "node log gateway URL to ship the agent's logs to (stored in the config)")
	cmd.Flags().StringVar(&serverCA, "server-ca", "", "PEM file of a CA to trust for the control plane's HTTPS (default: system roots)")
	addTransportFlag(cmd, g)
	addBackendFlag(cmd, g)
	return cmd
}

func httpClient(caFile string) (*http.Client, error) {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if caFile != "" {
		b, err := os.ReadFile(caFile)
		if err != nil {
			return nil, err
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(b) {
			return nil, fmt.Errorf("%s: no PEM certificate", caFile)
		}
		tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	// Redirects are not followed: a POST carrying a secret must go where it was sent.
	return &http.Client{Transport: tr, Timeout: time.Minute, CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse
	}}, nil
}

// ---------------------------------------------------------------------------------------

func runCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Connect to the control plane and serve until SIGTERM",
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := g.load(cmd, false)
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGTERM, syscall.SIGINT)
			defer stop()
			return agent.RunConfig(ctx, cfg, version, newLogger(cfg.LogLevel))
		},
	}
	addTransportFlag(cmd, g)
	addBackendFlag(cmd, g)
	cmd.Flags().StringVar(&g.runtime, "runtime", "auto", "allocation runtime: auto (process on a mock GPU backend, linux-user on nvml), process or linux-user")
	return cmd
}

// ---------------------------------------------------------------------------------------

func gpuCmd(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "gpu",
		Short: "Print the GPUs the backend sees, with one telemetry sample",
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := g.load(cmd, true)
			if err != nil {
				return err
			}
			seed := cfg.NodeID
			if seed == "" {
				seed = hostname(cfg)
			}
			b, err := gpu.Open(cfg.GPUBackend, gpu.Options{MockSeed: seed})
			if err != nil {
				return err
			}
			defer b.Close()
			inv, err := b.Inventory(cmd.Context())
			if err != nil {
				return err
			}
			samples, err := b.Sample(cmd.Context())
			if err != nil {
				return err
			}
			return printGPUs(cmd.OutOrStdout(), b.Name(), inv, samples, asJSON)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	addBackendFlag(cmd, g)
	return cmd
}

func printGPUs(w io.Writer, backend string, inv gpu.Inventory, samples []gpu.Metrics, asJSON bool) error {
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(struct {
			Backend   string        `json:"backend"`
			Inventory gpu.Inventory `json:"inventory"`
			Samples   []gpu.Metrics `json:"samples"`
		}{backend, inv, samples})
	}
	fmt.Fprintf(w, "backend %s, driver %s, CUDA %s, %d GPU(s)\n", backend, inv.DriverVersion, inv.CUDAVersion, len(inv.GPUs))
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "IDX\tUUID\tMODEL\tMEMORY\tPCI\tMIG\tUTIL\tMEM USED\tTEMP\tPOWER\tECC C/U\tHEALTHY")
	for i, g := range inv.GPUs {
		mig := "n/a"
		if g.MIGSupported {
			mig = map[bool]string{true: "on", false: "off"}[g.MIGEnabled]
		}
		var s gpu.Metrics
		if i < len(samples) {
			s = samples[i]
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%d MiB\t%s\t%s\t%d%%\t%d MiB\t%d C\t%.1f W\t%d/%d\t%v\n",
			g.Index, g.UUID, g.Model, g.MemoryBytes>>20, g.PCIBusID, mig,
			s.UtilizationPercent, s.MemoryUsedBytes>>20, s.TemperatureC, float64(s.PowerMilliwatts)/1000, s.ECCCorrected, s.ECCUncorrected, s.Healthy)
	}
	return tw.Flush()
}
