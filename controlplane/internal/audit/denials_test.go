package audit_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gantry-gpu/gantry/controlplane/internal/apitest"
	"github.com/gantry-gpu/gantry/controlplane/internal/audit"
	"github.com/gantry-gpu/gantry/shared/clock"
	"github.com/gantry-gpu/gantry/shared/ids"
	"github.com/gantry-gpu/gantry/shared/testenv"
)

func denial(ip string) audit.Denial {
	return audit.Denial{ActorType: audit.ActorUser, IP: ip, Method: "GET", Route: "/api/v1/me",
		OperationID: "getMe", Code: "token_missing", Status: 401, CorrelationID: "corr-" + ip}
}

func deniedCounts(t *testing.T, pool *pgxpool.Pool) (rows int, total int64, overflow int64) {
	t.Helper()
	err := pool.QueryRow(context.Background(), `SELECT count(*), coalesce(sum((metadata->>'count')::bigint), 0),
		coalesce(sum((metadata->>'count')::bigint) FILTER (WHERE metadata->>'overflow' = 'true' AND actor_user_id IS NULL AND NOT metadata ? 'ip'), 0)
		FROM audit_events WHERE action = 'auth.denied' AND result = 'failure'`).Scan(&rows, &total, &overflow)
	if err != nil {
		t.Fatal(err)
	}
	return rows, total, overflow
}

// TestDenialsFromManyAddressesAreBounded: past MaxKeys aggregates in a window, denials
// are still counted, in one overflow row per operation and code.
func TestDenialsFromManyAddressesAreBounded(t *testing.T) {
	pool := testenv.NewDatabase(t, apitest.Template)
	clk := clock.NewManual(time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC))
	d, err := audit.NewDenials(pool, clk, ids.V7{}, slog.New(slog.NewTextHandler(io.Discard, nil)), audit.DenialConfig{MaxKeys: 3}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		d.Observe(denial(fmt.Sprintf("10.0.0.%d", i)))
		d.Observe(denial(fmt.Sprintf("10.0.0.%d", i)))
	}
	if err := d.FlushAll(context.Background()); err != nil {
		t.Fatal(err)
	}
	rows, total, overflow := deniedCounts(t, pool)
	if rows != 4 || total != 20 || overflow != 14 {
		t.Fatalf("rows %d counting %d (overflow %d); want 4 rows (3 addresses + 1 overflow) counting 20 (overflow 14)", rows, total, overflow)
	}
}

// TestDenialsSurviveADatabaseOutage: with the database unreachable, Observe still only
// counts (the denial path has no I/O), Flush fails and keeps the rows up to MaxPending
// (older ones dropped and counted), and the kept rows are written once it is back.
func TestDenialsSurviveADatabaseOutage(t *testing.T) {
	pool := testenv.NewDatabase(t, apitest.Template)
	dead, err := pgxpool.New(context.Background(), "postgres://postgres@127.0.0.1:1/none?connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(dead.Close)
	clk := clock.NewManual(time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC))
	reg := prometheus.NewRegistry()
	d, err := audit.NewDenials(dead, clk, ids.V7{}, slog.New(slog.NewTextHandler(io.Discard, nil)), audit.DenialConfig{MaxKeys: 10, MaxPending: 4}, reg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for w := range 3 { // three windows of two addresses: six rows, two more than MaxPending
		d.Observe(denial(fmt.Sprintf("10.0.%d.1", w)))
		d.Observe(denial(fmt.Sprintf("10.0.%d.2", w)))
		clk.Advance(time.Minute)
		if err := d.Flush(ctx); err == nil {
			t.Fatal("flush to a dead database succeeded")
		}
	}
	if got := d.Pending(); got != 4 {
		t.Fatalf("pending %d, want MaxPending 4", got)
	}
	if got := metricValue(t, reg, "audit_denial_rows_dropped_total"); got != 2 {
		t.Fatalf("dropped %v, want 2", got)
	}
	d.SetPool(pool)
	if err := d.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if rows, total, _ := deniedCounts(t, pool); rows != 4 || total != 4 || d.Pending() != 0 {
		t.Fatalf("after recovery: %d rows counting %d, %d pending", rows, total, d.Pending())
	}
}

func metricValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}
