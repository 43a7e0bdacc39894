// Package loop runs the control plane's periodic background passes (budget evaluation,
// idle detection, report timeouts, certificate renewal, replica announcements): each
// pass is idempotent and safe on every replica, so a failed one is logged and simply
// runs again at the next tick.
package loop

import (
	"context"
	"log/slog"
	"time"
)

// Every runs pass every interval until ctx ends (interval <= 0: never). A failed pass is
// logged as "<what> failed" with its error and attrs; one cut short by ctx ending is not.
func Every(ctx context.Context, interval time.Duration, log *slog.Logger, what string, pass func(context.Context) error, attrs ...any) {
	if interval <= 0 {
		return
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := pass(ctx); err != nil && ctx.Err() == nil {
			log.WarnContext(ctx, what+" failed", append([]any{"err", err}, attrs...)...)
		}
	}
}
