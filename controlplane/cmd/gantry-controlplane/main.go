// Command gantry-controlplane serves the Gantry control plane API.
//
//	gantry-controlplane serve    run the API (configuration from the environment)
//	gantry-controlplane migrate  apply database migrations and exit
//	gantry-controlplane dev      everything on embedded defaults (what `make dev` runs)
package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"syscall"

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
	ln, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		return fmt.Errorf("listen %s: %w", cfg.HTTPAddr, err)
	}
	log.Info("serving", "addr", ln.Addr().String())
	return a.Run(ctx, ln)
}

func newMigrateCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "migrate",
		Short: "Apply database migrations to DATABASE_URL and exit",
		RunE: func(cmd *cobra.Command, _ []string) error {
			url := os.Getenv("DATABASE_URL")
			if url == "" {
				return fmt.Errorf("DATABASE_URL must be set")
			}
			if err := db.Migrate(cmd.Context(), url); err != nil {
				return err
			}
			fmt.Println("migrations applied; schema", db.SchemaVersion())
			return nil
		},
	}
}
