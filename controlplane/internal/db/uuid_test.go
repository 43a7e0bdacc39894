package db_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/shared/testenv"
)

// template hands its databases out as the application's role, as the control plane runs
// in production.
var template = testenv.Template{Name: "controlplane", Version: db.SchemaVersion(), Migrate: db.Migrate, Configure: db.ConfigurePool, AppRole: db.AppRole}

// The pool's connections encode and scan google/uuid values with the registered codec,
// not through database/sql's Valuer and Scanner (what pgx does by itself).
func TestConfiguredPoolUsesTheUUIDCodec(t *testing.T) {
	pool := testenv.NewDatabase(t, template)
	c, err := pool.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Release()
	m := c.Conn().TypeMap()
	plain := pgtype.NewMap()
	for _, v := range []any{uuid.UUID{}, uuid.NullUUID{}} {
		got := m.PlanEncode(pgtype.UUIDOID, pgtype.BinaryFormatCode, v)
		want := plain.PlanEncode(pgtype.UUIDOID, pgtype.BinaryFormatCode, v)
		if got == nil || typeName(got) == typeName(want) {
			t.Errorf("encode plan for %T: %s, the same as pgx's own (%s)", v, typeName(got), typeName(want))
		}
	}
	for _, target := range []any{new(uuid.UUID), new(uuid.NullUUID)} {
		got := m.PlanScan(pgtype.UUIDOID, pgtype.BinaryFormatCode, target)
		want := plain.PlanScan(pgtype.UUIDOID, pgtype.BinaryFormatCode, target)
		if got == nil || typeName(got) == typeName(want) {
			t.Errorf("scan plan for %T: %s, the same as pgx's own (%s)", target, typeName(got), typeName(want))
		}
	}
}

func typeName(v any) string { return fmt.Sprintf("%T", v) }

// Values survive the trip through PostgreSQL in both formats, NULLs included.
func TestUUIDRoundTrips(t *testing.T) {
	pool := testenv.NewDatabase(t, template)
	ctx := context.Background()
	u := uuid.MustParse("0190f3a4-7b7e-7c3d-9a51-2b9d4c1e8f60")

	for _, format := range []int16{pgtype.BinaryFormatCode, pgtype.TextFormatCode} {
		res := pgx.QueryResultFormats{format}
		var got uuid.UUID
		var text string
		if err := pool.QueryRow(ctx, `SELECT $1::uuid, $1::uuid::text`, res, u).Scan(&got, &text); err != nil {
			t.Fatalf("format %d: %v", format, err)
		}
		if got != u || text != u.String() {
			t.Errorf("format %d: scanned %s, PostgreSQL read %s; sent %s", format, got, text, u)
		}
		var null, valid uuid.NullUUID
		if err := pool.QueryRow(ctx, `SELECT $1::uuid, $2::uuid`, res, uuid.NullUUID{}, uuid.NullUUID{UUID: u, Valid: true}).Scan(&null, &valid); err != nil {
			t.Fatalf("format %d: %v", format, err)
		}
		if null.Valid || !valid.Valid || valid.UUID != u {
			t.Errorf("format %d: NULL came back as %+v, %s as %+v", format, null, u, valid)
		}
		var ptr *uuid.UUID
		if err := pool.QueryRow(ctx, `SELECT NULL::uuid`, res).Scan(&ptr); err != nil || ptr != nil {
			t.Errorf("format %d: NULL into *uuid.UUID: %v, %v", format, ptr, err)
		}
		got = u
		if err := pool.QueryRow(ctx, `SELECT NULL::uuid`, res).Scan(&got); err != nil || got != uuid.Nil {
			t.Errorf("format %d: NULL into uuid.UUID: %s, %v; want uuid.Nil and no error", format, got, err)
		}
	}

	// Arrays, and a nil pointer as NULL.
	ids := []uuid.UUID{u, uuid.Nil, uuid.MustParse("ffffffff-ffff-ffff-ffff-ffffffffffff")}
	var back []uuid.UUID
	var isNull bool
	if err := pool.QueryRow(ctx, `SELECT $1::uuid[], $2::uuid IS NULL`, ids, (*uuid.UUID)(nil)).Scan(&back, &isNull); err != nil {
		t.Fatal(err)
	}
	if len(back) != len(ids) || back[0] != ids[0] || back[1] != ids[1] || back[2] != ids[2] || !isNull {
		t.Errorf("uuid[] came back as %v (sent %v); nil pointer NULL: %v", back, ids, isNull)
	}
	// A uuid still goes where PostgreSQL wants text, as pgx did before.
	var s string
	if err := pool.QueryRow(ctx, `SELECT $1::text`, u).Scan(&s); err != nil || s != u.String() {
		t.Errorf("uuid as text: %q, %v", s, err)
	}
}

// The text encoding (used where a statement asks for text parameters).
func TestUUIDTextEncoding(t *testing.T) {
	m := pgtype.NewMap()
	db.RegisterTypes(m)
	u := uuid.New()
	buf, err := m.Encode(pgtype.UUIDOID, pgtype.TextFormatCode, u, nil)
	if err != nil || string(buf) != u.String() {
		t.Errorf("text: %q, %v; want %s", buf, err, u)
	}
	buf, err = m.Encode(pgtype.UUIDOID, pgtype.TextFormatCode, uuid.NullUUID{}, nil)
	if err != nil || buf != nil {
		t.Errorf("NULL as text: %q, %v", buf, err)
	}
	buf, err = m.Encode(pgtype.UUIDOID, pgtype.BinaryFormatCode, u, []byte("x"))
	if err != nil || string(buf[1:]) != string(u[:]) || buf[0] != 'x' {
		t.Errorf("binary appended after %q: %x, %v", "x", buf, err)
	}
}
