package sshkeys_test

import (
	"context"
	"crypto/elliptic"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/pagination"
	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/controlplane/internal/sshkeys"
	"github.com/gantry-gpu/gantry/proto/api"
	"github.com/gantry-gpu/gantry/shared/apierr"
	"github.com/gantry-gpu/gantry/shared/clock"
	"github.com/gantry-gpu/gantry/shared/ids"
	"github.com/gantry-gpu/gantry/shared/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func errorsAs(err error, target **apierr.Error) bool { return errors.As(err, target) }

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func setup(t *testing.T) (*pgxpool.Pool, *sshkeys.Service) {
	t.Helper()
	pool := testenv.NewDatabase(t, testenv.Template{Name: "controlplane", Version: db.SchemaVersion(), Migrate: db.Migrate, Configure: db.ConfigurePool, AppRole: db.AppRole})
	return pool, sshkeys.New(pool, clock.NewManual(t0), ids.V7{})
}

func newUser(t *testing.T, pool *pgxpool.Pool, name string) uuid.UUID {
	t.Helper()
	id := uuid.Must(uuid.NewV7())
	if _, err := pool.Exec(context.Background(),
		`INSERT INTO users (id, username, display_name, created_at, updated_at) VALUES ($1, $2, $2, $3, $3)`, id, name, t0); err != nil {
		t.Fatal(err)
	}
	return id
}

func count(t *testing.T, pool *pgxpool.Pool, q string, args ...any) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), q, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func wantCode(t *testing.T, err error, code apierr.Code, status int, reason string) {
	t.Helper()
	var e *apierr.Error
	if !errors.As(err, &e) || e.Code != code || e.HTTPStatus() != status || (reason != "" && e.Details["reason"] != reason) {
		t.Fatalf("want %s/%d/%s, got %v (%+v)", code, status, reason, err, e)
	}
}

func TestCreateListDelete(t *testing.T) {
	pool, svc := setup(t)
	ctx := context.Background()
	alice, bob := newUser(t, pool, "alice"), newUser(t, pool, "bob")
	line := ed25519Line(t, "alice@laptop")

	k, err := svc.Create(ctx, alice, uuid.Nil, "laptop", line)
	if err != nil || k.Name != "laptop" || k.KeyType != "ssh-ed25519" || k.Bits != 256 || *k.Comment != "alice@laptop" {
		t.Fatalf("create = %+v, %v", k, err)
	}
	// The same key again (other comment, other name) is a duplicate; nothing is persisted.
	_, err = svc.Create(ctx, alice, uuid.Nil, "again", k.PublicKey+" other-comment")
	wantCode(t, err, apierr.InvalidRequest, 409, "duplicate_key")
	// A refused weak key persists nothing either.
	_, err = svc.Create(ctx, alice, uuid.Nil, "weak", rsaLine(t, 1024))
	wantCode(t, err, apierr.ValidationError, 422, "weak_key")
	if n := count(t, pool, `SELECT count(*) FROM ssh_keys WHERE user_id = $1`, alice); n != 1 {
		t.Fatalf("alice keys = %d, want 1", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM audit_events WHERE action = 'ssh_key.create'`); n != 1 {
		t.Fatalf("audits = %d", n)
	}
	// Another user may hold the same key.
	if _, err := svc.Create(ctx, bob, uuid.Nil, "shared", line); err != nil {
		t.Fatal(err)
	}

	// Delete: another user's key is not found, and stays.
	wantCode(t, svc.Delete(ctx, bob, uuid.Nil, k.ID), apierr.InvalidRequest, 404, "not_found")
	if n := count(t, pool, `SELECT count(*) FROM ssh_keys WHERE id = $1`, k.ID); n != 1 {
		t.Fatal("bob deleted alice's key")
	}
	if err := svc.Delete(ctx, alice, uuid.Nil, k.ID); err != nil {
		t.Fatal(err)
	}
	wantCode(t, svc.Delete(ctx, alice, uuid.Nil, k.ID), apierr.InvalidRequest, 404, "not_found")
	if n := count(t, pool, `SELECT count(*) FROM audit_events WHERE action = 'ssh_key.delete'`); n != 1 {
		t.Fatalf("delete audits = %d", n)
	}
}

func TestResolve(t *testing.T) {
	pool, svc := setup(t)
	ctx := context.Background()
	alice, bob, carol := newUser(t, pool, "alice"), newUser(t, pool, "bob"), newUser(t, pool, "carol")
	a1, err := svc.Create(ctx, alice, uuid.Nil, "a1", ed25519Line(t, ""))
	if err != nil {
		t.Fatal(err)
	}
	a2, err := svc.Create(ctx, alice, uuid.Nil, "a2", ecdsaLine(t, elliptic.P256()))
	if err != nil {
		t.Fatal(err)
	}
	b1, err := svc.Create(ctx, bob, uuid.Nil, "b1", ed25519Line(t, ""))
	if err != nil {
		t.Fatal(err)
	}

	all, err := svc.Resolve(ctx, alice, nil)
	if err != nil || len(all) != 2 {
		t.Fatalf("all = %v, %v", all, err)
	}
	one, err := svc.Resolve(ctx, alice, []uuid.UUID{a2.ID, a2.ID})
	if err != nil || len(one) != 1 || one[0].ID != a2.ID {
		t.Fatalf("explicit = %v, %v", one, err)
	}
	_, err = svc.Resolve(ctx, alice, []uuid.UUID{a1.ID, b1.ID})
	wantCode(t, err, apierr.ValidationError, 422, "ssh_key_not_found")
	if !errors.Is(err, sshkeys.ErrNoResolvableKey) {
		t.Fatalf("want ErrNoResolvableKey, got %v", err)
	}
	_, err = svc.Resolve(ctx, carol, nil)
	wantCode(t, err, apierr.ValidationError, 422, "no_ssh_key")
	if !errors.Is(err, sshkeys.ErrNoResolvableKey) {
		t.Fatalf("want ErrNoResolvableKey, got %v", err)
	}
}

func TestHandlers(t *testing.T) {
	pool, svc := setup(t)
	alice, bob := newUser(t, pool, "alice"), newUser(t, pool, "bob")
	h := sshkeys.NewHandlers(svc, pagination.Codec{Key: []byte("k")})
	as := func(id uuid.UUID) context.Context {
		return principal.With(context.Background(), &principal.Principal{UserID: id})
	}
	for i := 0; i < 3; i++ {
		res, err := h.CreateSSHKey(as(alice), api.CreateSSHKeyRequestObject{Body: &api.CreateSSHKeyRequest{Name: "k", PublicKey: ed25519Line(t, "")}})
		if err != nil {
			t.Fatal(err)
		}
		if k := res.(api.CreateSSHKey201JSONResponse).Body; k.Bits == nil || *k.Bits != 256 {
			t.Fatalf("key = %+v", k)
		}
	}
	size := 2
	res, err := h.ListSSHKeys(as(alice), api.ListSSHKeysRequestObject{Params: api.ListSSHKeysParams{PageSize: &size}})
	if err != nil {
		t.Fatal(err)
	}
	p1 := res.(api.ListSSHKeys200JSONResponse).Body
	if len(p1.Items) != 2 || p1.Pagination.NextCursor == nil {
		t.Fatalf("page 1 = %+v", p1)
	}
	res, err = h.ListSSHKeys(as(alice), api.ListSSHKeysRequestObject{Params: api.ListSSHKeysParams{PageSize: &size, Cursor: p1.Pagination.NextCursor}})
	if err != nil {
		t.Fatal(err)
	}
	if p2 := res.(api.ListSSHKeys200JSONResponse).Body; len(p2.Items) != 1 || p2.Pagination.NextCursor != nil {
		t.Fatalf("page 2 = %+v", p2)
	}
	res, err = h.ListSSHKeys(as(bob), api.ListSSHKeysRequestObject{})
	if err != nil || len(res.(api.ListSSHKeys200JSONResponse).Body.Items) != 0 {
		t.Fatalf("bob sees %+v, %v", res, err)
	}
	_, err = h.DeleteSSHKey(as(bob), api.DeleteSSHKeyRequestObject{KeyID: p1.Items[0].ID})
	wantCode(t, err, apierr.InvalidRequest, 404, "not_found")
	if _, err := h.DeleteSSHKey(as(alice), api.DeleteSSHKeyRequestObject{KeyID: p1.Items[0].ID}); err != nil {
		t.Fatal(err)
	}
}

var _ interface {
	ListSSHKeys(context.Context, api.ListSSHKeysRequestObject) (api.ListSSHKeysResponseObject, error)
	CreateSSHKey(context.Context, api.CreateSSHKeyRequestObject) (api.CreateSSHKeyResponseObject, error)
	DeleteSSHKey(context.Context, api.DeleteSSHKeyRequestObject) (api.DeleteSSHKeyResponseObject, error)
} = (*sshkeys.Handlers)(nil)
