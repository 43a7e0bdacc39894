package devenv

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/gantry-gpu/gantry/controlplane/internal/audit"
	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/controlplane/internal/projectctx"
)

// The demo service account: member of the demo project, with one credential whose
// secret is GANTRY_DEMO_CLIENT_SECRET (secrets.env, copied to dev.env).
const (
	DemoServiceAccount = "demo-ci"
	DemoClientID       = "gci_demo"
)

// demoServiceAccount makes sure the demo service account, its role in the default
// project and its credential exist, the credential active with the given secret.
func (s *seeder) demoServiceAccount(ctx context.Context, tx pgx.Tx) error {
	secret := s.in.DemoClientSecret
	now := s.in.Clock.Now()
	var saID, userID uuid.UUID
	err := tx.QueryRow(ctx, `SELECT id, user_id FROM service_accounts WHERE tenant_id = $1 AND name = $2 AND deleted_at IS NULL`,
		s.out.TenantID, DemoServiceAccount).Scan(&saID, &userID)
	if errors.Is(err, pgx.ErrNoRows) {
		saID, userID = s.in.IDs.New(), s.in.IDs.New()
		if _, err := tx.Exec(ctx, `INSERT INTO users (id, username, display_name, password_hash, role, status, created_at, updated_at)
			VALUES ($1, $2, $3, NULL, 'user', 'active', $4, $4)`, userID, "sa-"+hex.EncodeToString(userID[:]), DemoServiceAccount, now); err != nil {
			return fmt.Errorf("demo service account user: %w", err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO service_accounts (id, tenant_id, user_id, name, description, created_by, created_at)
			VALUES ($1, $2, $3, $4, 'seeded by make dev', NULL, $5)`, saID, s.out.TenantID, userID, DemoServiceAccount, now); err != nil {
			return fmt.Errorf("demo service account: %w", err)
		}
		if err := s.audit.Record(ctx, tx, audit.Entry{Action: "service_account.create", TargetType: "service_account", TargetID: saID.String(),
			TenantID: s.out.TenantID, ActorType: audit.ActorSystem, Metadata: map[string]any{"source": "make dev"}}); err != nil {
			return err
		}
		s.out.Changes = append(s.out.Changes, "created service account "+DemoServiceAccount)
	} else if err != nil {
		return fmt.Errorf("look up demo service account: %w", err)
	}
	tag, err := tx.Exec(ctx, `INSERT INTO service_account_project_roles (service_account_id, project_id, role, created_at) VALUES ($1, $2, $3, $4)
		ON CONFLICT (service_account_id, project_id) DO UPDATE SET role = EXCLUDED.role WHERE service_account_project_roles.role <> EXCLUDED.role`,
		saID, s.out.ProjectID, projectctx.RoleMember, now)
	if err != nil {
		return fmt.Errorf("demo service account role: %w", err)
	}
	if tag.RowsAffected() > 0 {
		s.out.Changes = append(s.out.Changes, "made "+DemoServiceAccount+" a member of the default project")
	}
	hash := sha256.Sum256([]byte(secret))
	var credSA uuid.NullUUID
	var ok bool
	err = tx.QueryRow(ctx, `SELECT service_account_id, (secret_hash = $2 AND revoked_at IS NULL AND expires_at IS NULL)
		FROM access_credentials WHERE client_id = $1`, DemoClientID, hash[:]).Scan(&credSA, &ok)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		id := s.in.IDs.New()
		if _, err := tx.Exec(ctx, `INSERT INTO access_credentials (id, tenant_id, kind, service_account_id, user_id, name, client_id, secret_hash, created_at)
			VALUES ($1, $2, $3, $4, $5, 'demo', $6, $7, $8)`, id, s.out.TenantID, principal.MachineServiceAccount, saID, userID, DemoClientID, hash[:], now); err != nil {
			return fmt.Errorf("demo credential: %w", err)
		}
		s.out.Changes = append(s.out.Changes, "created credential "+DemoClientID+" of "+DemoServiceAccount)
	case err != nil:
		return fmt.Errorf("look up demo credential: %w", err)
	case credSA.UUID != saID || !ok:
		if _, err := tx.Exec(ctx, `UPDATE access_credentials SET service_account_id = $2, user_id = $3, tenant_id = $4, secret_hash = $5,
			revoked_at = NULL, revoked_by = NULL, expires_at = NULL WHERE client_id = $1`, DemoClientID, saID, userID, s.out.TenantID, hash[:]); err != nil {
			return fmt.Errorf("reset demo credential: %w", err)
		}
		s.out.Changes = append(s.out.Changes, "reset credential "+DemoClientID+" to the secret in "+SecretsFile)
	}
	s.out.DemoClientID = DemoClientID
	return nil
}
