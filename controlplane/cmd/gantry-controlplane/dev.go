package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/gantry-gpu/gantry/controlplane/internal/app"
	"github.com/gantry-gpu/gantry/controlplane/internal/devenv"
	"github.com/gantry-gpu/gantry/controlplane/internal/server"
	"github.com/gantry-gpu/gantry/shared/obs"
)

func newDevCmd() *cobra.Command {
	var dir string
	cmd := &cobra.Command{
		Use:   "dev",
		Short: "Run the control plane on embedded defaults, seeded with an admin and a demo tenant (make dev)",
		Long: `dev runs the control plane with nothing to set up by hand: PostgreSQL from
GANTRY_MIGRATE_DATABASE_URL or DATABASE_URL (the schema owner's), else the local server on
127.0.0.1:5432 (database gantry_dev), else a throwaway cluster under --dir; NATS from
NATS_URL, else an embedded nats-server with JetStream. It applies the migrations as the
owner and runs the control plane as the application's database role (gantry_app), seeds a
platform admin, a demo tenant, user and project, writes <dir>/dev.env with the URLs and the
logins, and runs until Ctrl-C.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runDev(cmd.Context(), dir, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	cmd.Flags().StringVar(&dir, "dir", ".dev", "directory for the throwaway services, secrets and dev.env")
	return cmd
}

func runDev(ctx context.Context, dir string, stdout, stderr io.Writer) (err error) {
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		stop() // a second Ctrl-C kills at once
	}()
	notef := func(format string, args ...any) { fmt.Fprintf(stderr, "dev: "+format+"\n", args...) }

	env, err := devenv.Start(ctx, devenv.Options{Dir: dir, Notef: notef})
	if err != nil {
		return interrupted(ctx, fmt.Errorf("dev environment: %w", err))
	}
	defer func() {
		if cerr := env.Close(); cerr != nil && err == nil {
			err = cerr
		}
	}()

	setDefault("GANTRY_HTTP_ADDR", "127.0.0.1:8080")
	setDefault("GANTRY_LOGGATEWAY_ADDR", "127.0.0.1:3100")
	setDefault("GANTRY_MASTER_KEY", env.MasterKey)
	// Prometheus and Alertmanager from the machine's packages, when installed and not
	// configured elsewhere: the observability read models then have real sources.
	var monitoring *devenv.Monitoring
	if os.Getenv("GANTRY_PROMETHEUS_URL") == "" && os.Getenv("GANTRY_ALERTMANAGER_URL") == "" {
		cpAddr := os.Getenv("GANTRY_HTTP_ADDR")
		monitoring, err = devenv.PrepareMonitoring(devenv.MonitoringOptions{Dir: dir, ControlPlaneAddr: cpAddr,
			ControlPlaneURL: "http://" + cpAddr, GatewayAddr: os.Getenv("GANTRY_LOGGATEWAY_ADDR")})
		if err != nil {
			notef("monitoring: not started: %v; the observability read models will say so", err)
			monitoring = nil
		} else {
			os.Setenv("GANTRY_PROMETHEUS_URL", monitoring.PrometheusURL)
			os.Setenv("GANTRY_ALERTMANAGER_URL", monitoring.AlertmanagerURL)
			setDefault("GANTRY_ALERT_RECEIVER_TOKEN_FILE", monitoring.ReceiverTokenFile)
			setDefault("GANTRY_NODE_METRICS_TOKEN_FILE", monitoring.NodeMetricsTokenFile)
		}
	}
	os.Setenv("DATABASE_URL", env.DatabaseURL)
	os.Setenv("NATS_URL", env.NATSURL)
	defer startDevMaas(ctx, dir, notef)() // GANTRY_DEV_MAAS=1: simulated MAAS + agent package (devmaas.go)
	cfg, err := app.LoadConfig(true)
	if err != nil {
		return err
	}
	log := obs.NewLogger(stderr, server.ServiceName, cfg.Level())
	app.ApplyGCPercent(cfg.GCPercent)

	a, err := app.New(ctx, cfg, log, app.Options{})
	if err != nil {
		return interrupted(ctx, fmt.Errorf("assemble control plane: %w", err))
	}
	defer a.Close()

	seeded, err := devenv.Seed(ctx, a.Pool, devenv.SeedInput{
		AdminPassword: env.Secrets.AdminPassword, DemoPassword: env.Secrets.DemoPassword,
		DemoClientSecret: env.Secrets.DemoClientSecret, Clock: a.Clock, IDs: a.IDs,
	})
	if err != nil {
		return interrupted(ctx, err)
	}
	for _, c := range seeded.Changes {
		notef("seed: %s", c)
	}

	ln, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w (set GANTRY_HTTP_ADDR to another address)", cfg.HTTPAddr, err)
	}
	url := "http://" + dialable(ln.Addr())

	// The log gateway runs as its own process, as in production, and writes node log
	// batches to a local file (no LOKI_URL in dev).
	gatewayAddr := os.Getenv("GANTRY_LOGGATEWAY_ADDR")
	nodeLogs := filepath.Join(dir, "logs", "nodes.log")
	kids := &children{logDir: filepath.Join(dir, "logs"), notef: notef}
	kidsCtx, stopKids := context.WithCancel(ctx)
	defer func() { stopKids(); kids.wait() }()
	if err := kids.start(kidsCtx, "gantry-loggateway", []string{
		"GANTRY_CONTROLPLANE_URL=" + url, "GANTRY_LOGGATEWAY_FILE=" + nodeLogs,
	}); err != nil {
		ln.Close()
		return fmt.Errorf("start the log gateway: %w", err)
	}

	if monitoring != nil {
		for _, m := range []struct {
			name string
			argv []string
		}{{"prometheus", monitoring.Prometheus}, {"alertmanager", monitoring.Alertmanager}} {
			if err := kids.startAt(kidsCtx, m.argv[0], m.name, nil, m.argv[1:]...); err != nil {
				notef("monitoring: %s did not start: %v", m.name, err)
			}
		}
		notef("monitoring: Prometheus %s and Alertmanager %s (logs in %s)", monitoring.PrometheusURL, monitoring.AlertmanagerURL,
			relPath(filepath.Join(dir, "logs")))
	}

	envFile := filepath.Join(dir, "dev.env")
	err = devenv.WriteEnvFile(envFile, "Written by `make dev` on every start: source it (. "+envFile+") in another shell.", []devenv.Var{
		{Key: "GANTRY_URL", Value: url},
		{Key: "GANTRY_ADMIN_USER", Value: devenv.AdminUsername},
		{Key: "GANTRY_ADMIN_PASSWORD", Value: env.Secrets.AdminPassword},
		{Key: "GANTRY_DEMO_USER", Value: devenv.DemoUsername},
		{Key: "GANTRY_DEMO_PASSWORD", Value: env.Secrets.DemoPassword},
		{Key: "GANTRY_DEMO_PROJECT_ID", Value: seeded.ProjectID.String()},
		// The demo service account (member of the demo project): POST /api/v1/auth/token.
		{Key: "GANTRY_DEMO_CLIENT_ID", Value: seeded.DemoClientID},
		{Key: "GANTRY_DEMO_CLIENT_SECRET", Value: env.Secrets.DemoClientSecret},
		{Key: "DATABASE_URL", Value: env.DatabaseURL},
		{Key: "GANTRY_MIGRATE_DATABASE_URL", Value: env.MigrateDatabaseURL},
		{Key: "NATS_URL", Value: env.NATSURL},
		{Key: "GANTRY_LOGGATEWAY_URL", Value: "http://" + gatewayAddr},
	})
	if err != nil {
		ln.Close()
		return fmt.Errorf("write %s: %w", envFile, err)
	}
	printBanner(stdout, url, envFile, env, relPath(env.SSHPublicKey))

	// The dev node agent enrolls through the API like a real host, so it starts once the
	// control plane answers.
	go func() {
		if err := waitHealthy(kidsCtx, url+"/api/v1/health"); err != nil {
			return
		}
		node, err := startDevAgent(kidsCtx, a.Nodes, kids, dir, url, "http://"+gatewayAddr)
		if err != nil {
			if kidsCtx.Err() == nil {
				notef("node agent: %v", err)
			}
			return
		}
		notef("node agent for node %s (%s, mock H100s) started; its log is %s", node, devNodeName,
			relPath(filepath.Join(dir, "logs", "gantry-nodeagent.log")))
	}()

	if err := a.Run(ctx, ln); err != nil {
		return err
	}
	fmt.Fprintln(stderr, "dev: stopped")
	return nil
}

// interrupted turns an error caused by Ctrl-C during start-up into a quiet exit.
func interrupted(ctx context.Context, err error) error {
	if ctx.Err() != nil && errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

func printBanner(w io.Writer, url, envFile string, env *devenv.Env, sshPub string) {
	fmt.Fprintf(w, `
Gantry control plane (dev) is running at %s
  PostgreSQL: %s, as role %s (migrated as the owner)
  NATS:       %s
  Logins and URLs are in %s (secrets kept in %s).

Log in as the demo user (admin of tenant %q, owner of its default project):
  . %s
  TOKEN=$(curl -s "$GANTRY_URL/api/v1/auth/login" -H 'Content-Type: application/json' \
    -d "{\"username\":\"$GANTRY_DEMO_USER\",\"password\":\"$GANTRY_DEMO_PASSWORD\"}" \
    | sed -n 's/.*"access_token":"\([^"]*\)".*/\1/p')

Then try:
  curl -s "$GANTRY_URL/api/v1/me" -H "Authorization: Bearer $TOKEN"
  curl -s "$GANTRY_URL/api/v1/projects" -H "Authorization: Bearer $TOKEN"
  curl -s "$GANTRY_URL/api/v1/ssh-keys" -H "Authorization: Bearer $TOKEN" -H 'Content-Type: application/json' \
    -d "{\"name\":\"demo\",\"public_key\":\"$(cat %s)\"}"

The platform admin logs in the same way as $GANTRY_ADMIN_USER / $GANTRY_ADMIN_PASSWORD;
the dev node agent (mock H100s) shows up in fleet telemetry:
  ATOKEN=... (log in as the admin)
  curl -s "$GANTRY_URL/api/v1/admin/telemetry/fleet" -H "Authorization: Bearer $ATOKEN"
Node logs shipped through the log gateway ($GANTRY_LOGGATEWAY_URL) land in %s.
Ctrl-C stops everything.

`, url, env.Postgres, env.AppRole, env.NATS, envFile, filepath.Join(filepath.Dir(envFile), devenv.SecretsFile),
		devenv.DemoTenantName, envFile, sshPub, filepath.Join(filepath.Dir(envFile), "logs", "nodes.log"))
}

// dialable is addr with an unspecified host (":8080", "0.0.0.0") replaced by 127.0.0.1.
func dialable(addr net.Addr) string {
	tcp, ok := addr.(*net.TCPAddr)
	if !ok {
		return addr.String()
	}
	if tcp.IP == nil || tcp.IP.IsUnspecified() {
		return fmt.Sprintf("127.0.0.1:%d", tcp.Port)
	}
	return tcp.String()
}

func relPath(p string) string {
	if wd, err := os.Getwd(); err == nil {
		if r, err := filepath.Rel(wd, p); err == nil && !strings.HasPrefix(r, "..") {
			return r
		}
	}
	return p
}

func setDefault(key, value string) {
	if os.Getenv(key) == "" {
		os.Setenv(key, value)
	}
}
