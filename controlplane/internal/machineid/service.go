package machineid

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/gantry-gpu/gantry/controlplane/internal/audit"
	"github.com/gantry-gpu/gantry/controlplane/internal/auth"
	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/machineid/machineiddb"
	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/controlplane/internal/projectctx"
	"github.com/gantry-gpu/gantry/shared/apierr"
	"github.com/gantry-gpu/gantry/shared/clock"
	"github.com/gantry-gpu/gantry/shared/ids"
)

// Service manages machine identities and issues their tokens.
type Service struct {
	pool   *pgxpool.Pool
	clock  clock.Clock
	ids    ids.Source
	tokens *auth.Service
	audit  *audit.Log
	// rand is the secret source (crypto/rand.Reader in production).
	rand func([]byte) error
}

// New returns the service.
func New(pool *pgxpool.Pool, clk clock.Clock, idSrc ids.Source, tokens *auth.Service) *Service {
	return &Service{pool: pool, clock: clk, ids: idSrc, tokens: tokens, audit: &audit.Log{Clock: clk, IDs: idSrc},
		rand: func(b []byte) error { _, err := rand.Read(b); return err }}
}

// ProjectRole is a service account's role in one project.
type ProjectRole struct {
	ProjectID uuid.UUID
	Role      string
}

// ServiceAccount is a live service account with its live project roles.
type ServiceAccount struct {
	machineiddb.ServiceAccount
	Roles []ProjectRole
}

// Created is a new credential with its secret, which exists only in this answer.
type Created struct {
	Credential machineiddb.AccessCredential
	Secret     string
}

func machineRole(role string) bool {
	return role == projectctx.RoleAdmin || role == projectctx.RoleMember || role == projectctx.RoleViewer
}

// newMachineUser inserts the users row a new machine identity acts as.
func (s *Service) newMachineUser(ctx context.Context, q *machineiddb.Queries, prefix, name string, now time.Time) (uuid.UUID, error) {
	id := s.ids.New()
	err := q.InsertMachineUser(ctx, machineiddb.InsertMachineUserParams{
		ID: id, Username: prefix + hex.EncodeToString(id[:]), DisplayName: name, Now: now,
	})
	return id, err
}

// cleanName is a new identity's name, trimmed; a blank one is a validation error (the
// contract's minLength admits spaces, the tables' checks do not).
func cleanName(name string) (string, error) {
	name = strings.TrimSpace(name)
	if name == "" {
		return "", apierr.Validation("name", "name must not be blank")
	}
	return name, nil
}

// CreateServiceAccount creates a service account of the caller's tenant.
func (s *Service) CreateServiceAccount(ctx context.Context, p *principal.Principal, name, description string, roles []ProjectRole) (ServiceAccount, error) {
	name, err := cleanName(name)
	if err != nil {
		return ServiceAccount{}, err
	}
	seen := map[uuid.UUID]bool{}
	for i, r := range roles {
		if !machineRole(r.Role) {
			return ServiceAccount{}, apierr.Validation(fmt.Sprintf("project_roles[%d].role", i), "a service account's role is admin, member or viewer")
		}
		if seen[r.ProjectID] {
			return ServiceAccount{}, apierr.Validation(fmt.Sprintf("project_roles[%d].project_id", i), "each project may appear once")
		}
		seen[r.ProjectID] = true
	}
	now := s.clock.Now()
	out := ServiceAccount{Roles: roles}
	err = db.InTx(ctx, s.pool, func(tx pgx.Tx) error {
		q := machineiddb.New(tx)
		for i, r := range roles {
			if _, err := q.LiveTenantProject(ctx, machineiddb.LiveTenantProjectParams{ProjectID: r.ProjectID, TenantID: p.TenantID}); errors.Is(err, pgx.ErrNoRows) {
				return apierr.Validation(fmt.Sprintf("project_roles[%d].project_id", i), "no such project in your tenant")
			} else if err != nil {
				return err
			}
		}
		userID, err := s.newMachineUser(ctx, q, "sa-", name, now)
		if err != nil {
			return err
		}
		out.ServiceAccount = machineiddb.ServiceAccount{ID: s.ids.New(), TenantID: p.TenantID, UserID: userID, Name: name,
			Description: description, CreatedBy: uuid.NullUUID{UUID: p.UserID, Valid: true}, CreatedAt: now}
		sa := out.ServiceAccount
		if err := q.InsertServiceAccount(ctx, machineiddb.InsertServiceAccountParams{ID: sa.ID, TenantID: sa.TenantID, UserID: sa.UserID,
			Name: sa.Name, Description: sa.Description, CreatedBy: sa.CreatedBy, CreatedAt: now}); err != nil {
			if db.IsUniqueViolation(err, "service_accounts_live_name") {
				return apierr.New(apierr.InvalidRequest, "a service account with this name already exists").With("field", "name").With("reason", "already_exists").WithStatus(409)
			}
			return err
		}
		for _, r := range roles {
			if err := q.InsertServiceAccountProjectRole(ctx, machineiddb.InsertServiceAccountProjectRoleParams{
				ServiceAccountID: sa.ID, ProjectID: r.ProjectID, Role: r.Role, CreatedAt: now}); err != nil {
				return err
			}
		}
		return s.audit.Record(ctx, tx, audit.Entry{Action: "service_account.create", TargetType: "service_account",
			TargetID: sa.ID.String(), TenantID: p.TenantID, Metadata: map[string]any{"projects": len(roles)}})
	})
	return out, err
}

// ListServiceAccounts lists the tenant's live service accounts after after.
func (s *Service) ListServiceAccounts(ctx context.Context, tenantID, after uuid.UUID, size int) ([]ServiceAccount, bool, error) {
	q := machineiddb.New(db.Querier(ctx, s.pool))
	rows, err := q.ListServiceAccounts(ctx, machineiddb.ListServiceAccountsParams{TenantID: tenantID,
		After: uuid.NullUUID{UUID: after, Valid: after != uuid.Nil}, Lim: int32(size + 1)})
	if err != nil {
		return nil, false, err
	}
	more := len(rows) > size
	if more {
		rows = rows[:size]
	}
	if len(rows) == 0 {
		return nil, false, nil
	}
	idsOf := make([]uuid.UUID, len(rows))
	for i, r := range rows {
		idsOf[i] = r.ID
	}
	roles, err := q.ListServiceAccountProjectRoles(ctx, idsOf)
	if err != nil {
		return nil, false, err
	}
	by := map[uuid.UUID][]ProjectRole{}
	for _, r := range roles {
		by[r.ServiceAccountID] = append(by[r.ServiceAccountID], ProjectRole{ProjectID: r.ProjectID, Role: r.Role})
	}
	out := make([]ServiceAccount, len(rows))
	for i, r := range rows {
		out[i] = ServiceAccount{ServiceAccount: r, Roles: by[r.ID]}
	}
	return out, more, nil
}

// notFound is the contract's answer for an object that is not there (or not the
// caller's): invalid_request with 404, as elsewhere without a domain code.
func notFound(what string) *apierr.Error {
	return apierr.New(apierr.InvalidRequest, "%s not found", what).With("reason", "not_found").WithStatus(404)
}

func errServiceAccountNotFound() *apierr.Error { return notFound("service account") }

// DeleteServiceAccount deletes a service account of the caller's tenant and revokes its
// credentials at once.
func (s *Service) DeleteServiceAccount(ctx context.Context, p *principal.Principal, id uuid.UUID) error {
	now := s.clock.Now()
	return db.InTx(ctx, s.pool, func(tx pgx.Tx) error {
		q := machineiddb.New(tx)
		sa, err := q.LockLiveServiceAccount(ctx, machineiddb.LockLiveServiceAccountParams{ID: id, TenantID: p.TenantID})
		if errors.Is(err, pgx.ErrNoRows) {
			return errServiceAccountNotFound()
		}
		if err != nil {
			return err
		}
		by := uuid.NullUUID{UUID: p.UserID, Valid: true}
		if err := q.RevokeServiceAccountCredentials(ctx, machineiddb.RevokeServiceAccountCredentialsParams{Now: &now, By: by, ServiceAccountID: uuid.NullUUID{UUID: id, Valid: true}}); err != nil {
			return err
		}
		if err := q.MarkServiceAccountDeleted(ctx, machineiddb.MarkServiceAccountDeletedParams{Now: &now, ID: id}); err != nil {
			return err
		}
		if err := q.DisableMachineUser(ctx, machineiddb.DisableMachineUserParams{Now: now, ID: sa.UserID}); err != nil {
			return err
		}
		return s.audit.Record(ctx, tx, audit.Entry{Action: "service_account.delete", TargetType: "service_account",
			TargetID: id.String(), TenantID: p.TenantID})
	})
}

// newSecret returns a client secret and its hash.
func (s *Service) newSecret() (string, []byte, error) {
	var b [32]byte
	if err := s.rand(b[:]); err != nil {
		return "", nil, err
	}
	secret := auth.ClientSecretPrefix + base64.RawURLEncoding.EncodeToString(b[:])
	h := sha256.Sum256([]byte(secret))
	return secret, h[:], nil
}

func (s *Service) checkExpiry(expiresAt *time.Time) error {
	if expiresAt != nil && !expiresAt.After(s.clock.Now()) {
		return apierr.Validation("expires_at", "expires_at must be in the future")
	}
	return nil
}

// insertCredential stores a new credential with a fresh client id and secret.
func (s *Service) insertCredential(ctx context.Context, tx pgx.Tx, arg machineiddb.InsertCredentialParams) (Created, error) {
	secret, hash, err := s.newSecret()
	if err != nil {
		return Created{}, err
	}
	arg.ID = s.ids.New()
	arg.ClientID = "gci_" + hex.EncodeToString(arg.ID[:])
	arg.SecretHash = hash
	c, err := machineiddb.New(tx).InsertCredential(ctx, arg)
	if err != nil {
		return Created{}, err
	}
	return Created{Credential: c, Secret: secret}, nil
}

// CreateServiceAccountCredential adds a client credential to a service account.
func (s *Service) CreateServiceAccountCredential(ctx context.Context, p *principal.Principal, saID uuid.UUID, name string, expiresAt *time.Time) (Created, error) {
	name, err := cleanName(name)
	if err != nil {
		return Created{}, err
	}
	if err := s.checkExpiry(expiresAt); err != nil {
		return Created{}, err
	}
	now := s.clock.Now()
	var out Created
	err = db.InTx(ctx, s.pool, func(tx pgx.Tx) error {
		sa, err := machineiddb.New(tx).LockLiveServiceAccount(ctx, machineiddb.LockLiveServiceAccountParams{ID: saID, TenantID: p.TenantID})
		if errors.Is(err, pgx.ErrNoRows) {
			return errServiceAccountNotFound()
		}
		if err != nil {
			return err
		}
		out, err = s.insertCredential(ctx, tx, machineiddb.InsertCredentialParams{
			TenantID: p.TenantID, Kind: principal.MachineServiceAccount, ServiceAccountID: uuid.NullUUID{UUID: sa.ID, Valid: true},
			UserID: sa.UserID, Name: name, ExpiresAt: expiresAt,
			CreatedBy: uuid.NullUUID{UUID: p.UserID, Valid: true}, CreatedAt: now,
		})
		if err != nil {
			return err
		}
		return s.audit.Record(ctx, tx, audit.Entry{Action: "access_credential.create", TargetType: "access_credential",
			TargetID: out.Credential.ID.String(), TenantID: p.TenantID, Metadata: map[string]any{"service_account_id": sa.ID.String()}})
	})
	return out, err
}

// CreateProjectCredential creates a project access credential in proj with role.
func (s *Service) CreateProjectCredential(ctx context.Context, p *principal.Principal, proj projectctx.Project, name, role string, expiresAt *time.Time) (Created, error) {
	name, err := cleanName(name)
	if err != nil {
		return Created{}, err
	}
	if !machineRole(role) {
		return Created{}, apierr.Validation("role", "role is admin, member or viewer")
	}
	if !proj.AtLeast(role) {
		return Created{}, apierr.Forbidden("you cannot grant a role stronger than your own").With("role", proj.Role).With("required_role", role)
	}
	if err := s.checkExpiry(expiresAt); err != nil {
		return Created{}, err
	}
	now := s.clock.Now()
	var out Created
	err = db.InTx(ctx, s.pool, func(tx pgx.Tx) error {
		q := machineiddb.New(tx)
		userID, err := s.newMachineUser(ctx, q, "pac-", name, now)
		if err != nil {
			return err
		}
		out, err = s.insertCredential(ctx, tx, machineiddb.InsertCredentialParams{
			TenantID: proj.TenantID, Kind: principal.MachineProjectCredential, ProjectID: uuid.NullUUID{UUID: proj.ID, Valid: true},
			ProjectRole: &role, UserID: userID, Name: name, ExpiresAt: expiresAt,
			CreatedBy: uuid.NullUUID{UUID: p.UserID, Valid: true}, CreatedAt: now,
		})
		if err != nil {
			return err
		}
		return s.audit.Record(ctx, tx, audit.Entry{Action: "access_credential.create", TargetType: "access_credential",
			TargetID: out.Credential.ID.String(), TenantID: proj.TenantID, ProjectID: proj.ID, Metadata: map[string]any{"role": role}})
	})
	return out, err
}

// ListFilter selects credentials.
type ListFilter struct {
	TenantID, ProjectID uuid.UUID
	Kind, Status        string
	Before              uuid.UUID
}

// ListCredentials lists credentials newest first.
func (s *Service) ListCredentials(ctx context.Context, f ListFilter, size int) ([]machineiddb.AccessCredential, bool, error) {
	now := s.clock.Now()
	arg := machineiddb.ListCredentialsParams{
		TenantID: uuid.NullUUID{UUID: f.TenantID, Valid: f.TenantID != uuid.Nil}, ProjectID: uuid.NullUUID{UUID: f.ProjectID, Valid: f.ProjectID != uuid.Nil},
		Now: &now, Before: uuid.NullUUID{UUID: f.Before, Valid: f.Before != uuid.Nil}, Lim: int32(size + 1),
	}
	if f.Kind != "" {
		arg.Kind = &f.Kind
	}
	if f.Status != "" {
		arg.Status = &f.Status
	}
	rows, err := machineiddb.New(db.Querier(ctx, s.pool)).ListCredentials(ctx, arg)
	if err != nil {
		return nil, false, err
	}
	more := len(rows) > size
	if more {
		rows = rows[:size]
	}
	return rows, more, nil
}

// Revoke revokes credential id; projectID, when not uuid.Nil, must be its project (a
// credential of another project is not found). Revoking a revoked credential is a no-op.
func (s *Service) Revoke(ctx context.Context, id, projectID uuid.UUID) error {
	p, _ := principal.From(ctx)
	now := s.clock.Now()
	return db.InTx(ctx, s.pool, func(tx pgx.Tx) error {
		q := machineiddb.New(tx)
		c, err := q.LockCredential(ctx, id)
		if errors.Is(err, pgx.ErrNoRows) || (err == nil && projectID != uuid.Nil && c.ProjectID.UUID != projectID) {
			return notFound("access credential")
		}
		if err != nil {
			return err
		}
		if c.RevokedAt != nil {
			return nil
		}
		by := uuid.NullUUID{}
		if p != nil {
			by = uuid.NullUUID{UUID: p.UserID, Valid: true}
		}
		if err := q.RevokeCredential(ctx, machineiddb.RevokeCredentialParams{Now: &now, By: by, ID: id}); err != nil {
			return err
		}
		if c.Kind == principal.MachineProjectCredential {
			if err := q.DisableMachineUser(ctx, machineiddb.DisableMachineUserParams{Now: now, ID: c.UserID}); err != nil {
				return err
			}
		}
		return s.audit.Record(ctx, tx, audit.Entry{Action: "access_credential.revoke", TargetType: "access_credential",
			TargetID: id.String(), TenantID: c.TenantID, ProjectID: c.ProjectID.UUID})
	})
}

// Status is a credential's status at now.
func Status(c machineiddb.AccessCredential, now time.Time) string {
	switch {
	case c.RevokedAt != nil:
		return "revoked"
	case c.ExpiresAt != nil && !c.ExpiresAt.After(now):
		return "expired"
	}
	return "active"
}
