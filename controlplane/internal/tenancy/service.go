package tenancy

import (
	"context"
	"errors"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/gantry-gpu/gantry/controlplane/internal/audit"
	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/outbox"
	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/controlplane/internal/tenancy/tenancydb"
	"github.com/gantry-gpu/gantry/shared/apierr"
	"github.com/gantry-gpu/gantry/shared/clock"
	"github.com/gantry-gpu/gantry/shared/ids"
)

// PasswordHasher turns a password into the stored hash (auth's HashPassword).
type PasswordHasher func(password string) (string, error)

// Service holds the tenancy domain: every mutation runs in db.InTx and writes its audit
// row (and outbox event, where one exists) with the same transaction.
type Service struct {
	Pool         *pgxpool.Pool
	Clock        clock.Clock
	IDs          ids.Source
	Audit        *audit.Log
	Outbox       *outbox.Writer
	HashPassword PasswordHasher
	// ProjectInUse, when set, reports whether a project still has live workloads; such a
	// project cannot be deleted. Features that own workloads provide it.
	ProjectInUse func(ctx context.Context, tx pgx.Tx, projectID uuid.UUID) (bool, error)
}

// New returns a Service whose audit log and outbox writer share clk and idSrc.
func New(pool *pgxpool.Pool, clk clock.Clock, idSrc ids.Source, hash PasswordHasher) *Service {
	return &Service{
		Pool:         pool,
		Clock:        clk,
		IDs:          idSrc,
		Audit:        &audit.Log{Clock: clk, IDs: idSrc},
		Outbox:       &outbox.Writer{Clock: clk, IDs: idSrc},
		HashPassword: hash,
	}
}

// read returns queries on the request's ambient transaction, else on the pool.
func (s *Service) read(ctx context.Context) *tenancydb.Queries {
	return tenancydb.New(db.Querier(ctx, s.Pool))
}

// Event subjects (ARCHITECTURE §4: gantry.events.<type>).
const (
	EventTenantCreated  = "tenant.created"
	EventProjectCreated = "project.created"
	EventProjectDeleted = "project.deleted"
)

func (s *Service) enqueue(ctx context.Context, tx pgx.Tx, typ string, payload map[string]any) error {
	_, err := s.Outbox.Enqueue(ctx, tx, outbox.Event{Type: typ, Subject: "gantry.events." + typ, Payload: payload})
	return err
}

// notFound is the 404 of objects the contract has no *_not_found code for.
func notFound(what string) *apierr.Error {
	e := apierr.New(apierr.InvalidRequest, "%s not found", what).With("reason", "not_found")
	e.Status = 404
	return e
}

// conflict is a 409 refusal of a rule about current state, named by reason.
func conflict(reason, format string, args ...any) *apierr.Error {
	e := apierr.New(apierr.InvalidRequest, format, args...).With("reason", reason)
	e.Status = 409
	return e
}

func slugTaken(what string) *apierr.Error {
	return conflict("slug_taken", "%s slug is already taken", what).With("field", "slug")
}

func isNoRows(err error) bool { return errors.Is(err, pgx.ErrNoRows) }

// tenantOf is the caller's tenant, or insufficient_permissions for callers outside one.
func tenantOf(p *principal.Principal) (uuid.UUID, error) {
	if p == nil || p.TenantID == uuid.Nil {
		return uuid.Nil, apierr.Forbidden("this operation needs a tenant member").With("reason", "no_tenant")
	}
	return p.TenantID, nil
}

// requireTenantAdmin refuses callers that do not administer their tenant.
func requireTenantAdmin(p *principal.Principal) (uuid.UUID, error) {
	t, err := tenantOf(p)
	if err != nil {
		return uuid.Nil, err
	}
	if !p.IsTenantAdmin(t) {
		return uuid.Nil, apierr.Forbidden("this operation needs a tenant admin").With("reason", "tenant_admin_required")
	}
	return t, nil
}

// requirePlatformAdmin refuses callers without platform.admin (seed §5 rule 4).
func requirePlatformAdmin(p *principal.Principal) error {
	if p == nil || !p.IsPlatformAdmin() {
		return apierr.New(apierr.AdminRequired, "this operation needs a platform admin")
	}
	return nil
}

// Page is one page of a keyset listing: More says whether rows follow the last item.
type Page[T any] struct {
	Items []T
	More  bool
}

// pageOf trims rows fetched with limit+1 to a page.
func pageOf[T any](rows []T, limit int) Page[T] {
	if len(rows) > limit {
		return Page[T]{Items: rows[:limit], More: true}
	}
	if rows == nil {
		rows = []T{}
	}
	return Page[T]{Items: rows}
}

func afterID(id uuid.UUID) uuid.NullUUID { return uuid.NullUUID{UUID: id, Valid: id != uuid.Nil} }
