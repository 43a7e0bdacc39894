package tenancy

import (
	"context"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/controlplane/internal/tenancy/tenancydb"
)

// BalanceSource answers a tenant's balance for GET /me. Billing provides the real one.
type BalanceSource interface {
	Balance(ctx context.Context, tenantID uuid.UUID) (amountMinor int64, currency string, err error)
}

// ZeroBalance answers 0 in the tenant's default currency (DefaultCurrency for callers
// outside a tenant); it stands in until billing exists.
type ZeroBalance struct {
	Pool *pgxpool.Pool
}

// Balance implements BalanceSource.
func (z ZeroBalance) Balance(ctx context.Context, tenantID uuid.UUID) (int64, string, error) {
	if tenantID == uuid.Nil {
		return 0, DefaultCurrency, nil
	}
	t, err := tenancydb.New(db.Querier(ctx, z.Pool)).GetTenant(ctx, tenantID)
	if isNoRows(err) {
		return 0, DefaultCurrency, nil
	}
	if err != nil {
		return 0, "", fmt.Errorf("tenant currency: %w", err)
	}
	return 0, t.DefaultCurrency, nil
}

// Me is the caller with the tenancy context GET /me shows: the organization and its
// default project (absent for callers outside a tenant).
type Me struct {
	User        tenancydb.User
	OrgID       uuid.UUID // uuid.Nil when none
	OrgName     string
	ProjectID   uuid.UUID // uuid.Nil when none
	ProjectName string
}

// Me loads the caller.
func (s *Service) Me(ctx context.Context, p *principal.Principal) (Me, error) {
	q := s.read(ctx)
	u, err := q.GetUser(ctx, p.UserID)
	if err != nil {
		return Me{}, fmt.Errorf("load user: %w", err)
	}
	me := Me{User: u}
	if !u.TenantID.Valid {
		return me, nil
	}
	t, err := q.GetTenant(ctx, u.TenantID.UUID)
	if err != nil {
		return Me{}, fmt.Errorf("load tenant: %w", err)
	}
	me.OrgID, me.OrgName = t.ID, t.Name
	dp, err := q.GetDefaultProject(ctx, t.ID)
	if err != nil && !isNoRows(err) {
		return Me{}, fmt.Errorf("default project: %w", err)
	}
	if err == nil {
		me.ProjectID, me.ProjectName = dp.ID, dp.Name
	}
	return me, nil
}
