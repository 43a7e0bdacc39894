// Command gantry is the Gantry command line (docs/cli.md).
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/gantry-gpu/gantry/cli/internal/command"
)

func main() {
	// Ctrl-C cancels the command's context: a wait stops (leaving the allocation as it
	// is) and a request in flight is abandoned, then the command exits 130.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := command.Run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
