package pgcluster

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/gantry-gpu/gantry/shared/testenv/ci"
)

// A frozen cluster accepts connections and answers nothing, on a connection opened
// before the freeze too; thawed, it answers again; Stop thaws a frozen one.
func TestFreezeThaw(t *testing.T) {
	_, err := BinDir()
	ci.SkipUnlessAvailable(t, "PostgreSQL binaries", err)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := Start(ctx, clusterDir(t), Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Stop() })
	conn, err := pgx.Connect(ctx, c.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())

	if err := c.Freeze(); err != nil {
		t.Fatal(err)
	}
	qctx, qcancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = conn.Exec(qctx, `SELECT 1`)
	qcancel()
	if err == nil {
		t.Fatal("a frozen server answered on an open connection")
	}
	pctx, pcancel := context.WithTimeout(ctx, 300*time.Millisecond)
	err = Ping(pctx, c.URL())
	pcancel()
	if err == nil {
		t.Fatal("a frozen server accepted a new session")
	}

	c.Thaw()
	if err := Ping(ctx, c.URL()); err != nil {
		t.Fatalf("thawed server: %v", err)
	}
	if err := c.Freeze(); err != nil {
		t.Fatal(err)
	}
	if err := c.Stop(); err != nil { // thaws first, else it would wait 10s and kill
		t.Fatalf("stop a frozen server: %v", err)
	}
}
