package db_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/shared/testenv"
)

// What the server answers 503 for, with the errors pgx really returns.
func TestIsUnavailable(t *testing.T) {
	ctx := context.Background()

	// Nothing listens: connection refused.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	_, refused := pgx.Connect(ctx, "postgres://postgres@"+addr+"/postgres?sslmode=disable")
	if refused == nil {
		t.Fatal("connected to nothing")
	}

	// A real server, and a query cut off by its context's deadline.
	pool := testenv.NewDatabase(t, template)
	// Open the pool's connection first: the deadline must cut off the query, not a
	// connection attempt that a loaded machine took longer than the deadline to make
	// (pgxpool then answers with the bare context error, which is another case below).
	if err := pool.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	dctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	_, deadline := pool.Exec(dctx, `SELECT pg_sleep(5)`)
	if deadline == nil {
		t.Fatal("pg_sleep(5) finished inside 200ms")
	}
	// statement_timeout: SQLSTATE 57014.
	var stmtTimeout error
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SET LOCAL statement_timeout = '10ms'`); err != nil {
			return err
		}
		_, stmtTimeout = tx.Exec(ctx, `SELECT pg_sleep(5)`)
		return stmtTimeout
	})
	if stmtTimeout == nil || err == nil {
		t.Fatal("statement_timeout did not fire")
	}
	// A refused query and a constraint violation are answers, not unavailability.
	_, syntax := pool.Exec(ctx, `SELEC 1`)
	_, violation := pool.Exec(ctx, `CREATE TEMP TABLE u (x int UNIQUE); INSERT INTO u VALUES (1), (1)`)
	var noRows error
	noRows = pool.QueryRow(ctx, `SELECT 1 WHERE false`).Scan(new(int))

	closed := pool.Config().Copy()
	cpool, err := pgxpool.NewWithConfig(ctx, closed)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := cpool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_ = conn.Conn().Close(ctx)
	_, onClosed := conn.Exec(ctx, `SELECT 1`)
	conn.Release()
	cpool.Close()

	cases := []struct {
		name        string
		err         error
		unavailable bool
		database    bool // IsDatabaseUnavailable too
	}{
		{"connection refused", refused, true, true},
		{"wrapped connection refused", fmt.Errorf("project access: %w", refused), true, true},
		{"query at the deadline", deadline, true, true},
		{"statement timeout", stmtTimeout, true, true},
		{"admin shutdown", &pgconn.PgError{Code: "57P01"}, true, true},
		{"cannot connect now", &pgconn.PgError{Code: "57P03"}, true, true},
		{"too many connections", &pgconn.PgError{Code: "53300"}, true, true},
		{"connection failure", &pgconn.PgError{Code: "08006"}, true, true},
		{"closed connection", onClosed, true, true},
		{"bare deadline", context.DeadlineExceeded, true, false},
		{"net error", &net.OpError{Op: "dial", Err: errors.New("refused")}, true, false},
		{"syntax error", syntax, false, false},
		{"unique violation", violation, false, false},
		{"serialization failure", &pgconn.PgError{Code: "40001"}, false, false},
		{"no rows", noRows, false, false},
		{"nil", nil, false, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if tc.err == nil && tc.name != "nil" {
				t.Fatal("the case produced no error")
			}
			if got := db.IsUnavailable(tc.err); got != tc.unavailable {
				t.Errorf("IsUnavailable(%v) = %v", tc.err, got)
			}
			if got := db.IsDatabaseUnavailable(tc.err); got != tc.database {
				t.Errorf("IsDatabaseUnavailable(%v) = %v", tc.err, got)
			}
		})
	}
}

// A pool bounds a connection attempt that never completes (a frozen server: the
// kernel accepts, nothing answers) by the connect timeout, not by the request's
// context, since pgxpool connects detached from the request.
func TestSetConnectTimeout(t *testing.T) {
	cfg, err := pgxpool.ParseConfig("postgres://postgres@127.0.0.1:1/postgres")
	if err != nil {
		t.Fatal(err)
	}
	db.SetConnectTimeout(cfg, 0)
	if cfg.ConnConfig.ConnectTimeout != db.DefaultConnectTimeout {
		t.Fatalf("connect timeout %s", cfg.ConnConfig.ConnectTimeout)
	}
	cfg, _ = pgxpool.ParseConfig("postgres://postgres@127.0.0.1:1/postgres?connect_timeout=7")
	db.SetConnectTimeout(cfg, time.Second)
	if cfg.ConnConfig.ConnectTimeout != 7*time.Second {
		t.Fatalf("the URL's connect_timeout was overridden: %s", cfg.ConnConfig.ConnectTimeout)
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0") // accepts (the kernel does), never answers
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	cfg, _ = pgxpool.ParseConfig("postgres://postgres@" + ln.Addr().String() + "/postgres?sslmode=disable")
	db.SetConnectTimeout(cfg, 200*time.Millisecond)
	done := make(chan error, 1)
	go func() {
		c, err := pgx.ConnectConfig(context.Background(), cfg.ConnConfig)
		if err == nil {
			c.Close(context.Background())
		}
		done <- err
	}()
	select {
	case err := <-done:
		if !db.IsDatabaseUnavailable(err) {
			t.Fatalf("connect to a server that never answers: %v, not unavailable", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("connect to a server that never answers did not give up")
	}
}
