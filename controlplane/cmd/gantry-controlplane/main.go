// Command gantry-controlplane serves the Gantry control plane API.
//
//	gantry-controlplane serve    run the API (configuration from the environment)
//	gantry-controlplane migrate  apply database migrations and exit
//	gantry-controlplane dev      everything on embedded defaults (what `make dev` runs)
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"syscall"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/gantry-gpu/gantry/controlplane/internal/app"
	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/server"
	"github.com/gantry-gpu/gantry/shared/obs"
)

func main() {
	root := &cobra.Command{
		Use:           "gantry-controlplane",
		Short:         "Gantry control plane: multi-tenant GPU cloud API",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(newServeCmd(), newMigrateCmd(), newDevCmd())
	if err := root.Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "gantry-controlplane:", err)
		os.Exit(1)
	}
}

func newServeCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "serve",
		Short: "Serve the API (DATABASE_URL, NATS_URL, GANTRY_MASTER_KEY required)",
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := app.LoadConfig(false)
			if err != nil {
				return err
			}
			if cfg.DatabaseURL == "" || cfg.NATSURL == "" {
				return fmt.Errorf("DATABASE_URL and NATS_URL must be set (or use `gantry-controlplane dev`)")
			}
			log := obs.NewLogger(os.Stderr, server.ServiceName, cfg.Level())
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return serve(ctx, cfg, log)
		},
	}
}

// serve assembles the control plane and runs it until ctx ends.
func serve(ctx context.Context, cfg app.Config, log *slog.Logger) error {
	a, err := app.New(ctx, cfg, log, app.Options{})
	if err != nil {
		return err
	}
	defer a.Close()
	if err := checkDatabaseRole(ctx, a.Pool, cfg.AllowPrivilegedDatabaseRole, log); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		return fmt.Errorf("listen %s: %w", cfg.HTTPAddr, err)
	}
	log.Info("serving", "addr", ln.Addr().String(), "gc_percent", app.ApplyGCPercent(cfg.GCPercent))
	return a.Run(ctx, ln)
}

// checkDatabaseRole refuses to serve as a database role that could switch the
// append-only tables' triggers off — their owner, a superuser (docs/development.md,
// "Database roles") — unless allowed, and then says so in the log.
func checkDatabaseRole(ctx context.Context, pool *pgxpool.Pool, allow bool, log *slog.Logger) error {
	role, err := db.CheckSessionRole(ctx, pool)
	if err == nil {
		return nil
	}
	if !errors.Is(err, db.ErrPrivilegedRole) || !allow {
		return fmt.Errorf("DATABASE_URL logs in as %q: %w; log in as the application role that migrate grants (GANTRY_APP_DATABASE_ROLE) and migrate with the owner's GANTRY_MIGRATE_DATABASE_URL", role, err)
	}
	log.Warn("running as a database role that can bypass the append-only tables (GANTRY_ALLOW_PRIVILEGED_DATABASE_ROLE)", "role", role, "err", err)
	return nil
}

func newMigrateCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "migrate",
		Short: "Apply database migrations as the schema owner (GANTRY_MIGRATE_DATABASE_URL, else DATABASE_URL) and grant the application role",
		RunE: func(cmd *cobra.Command, _ []string) error {
			url := os.Getenv("GANTRY_MIGRATE_DATABASE_URL")
			if url == "" {
				url = os.Getenv("DATABASE_URL")
			}
			if url == "" {
				return fmt.Errorf("GANTRY_MIGRATE_DATABASE_URL (the schema owner's) or DATABASE_URL must be set")
			}
			role := os.Getenv("GANTRY_APP_DATABASE_ROLE")
			if role == "" {
				role = db.AppRole
			}
			if err := db.MigrateFor(cmd.Context(), url, role); err != nil {
				return err
			}
			fmt.Println("migrations applied; schema", db.SchemaVersion(), "; application role", role)
			return nil
		},
	}
}
