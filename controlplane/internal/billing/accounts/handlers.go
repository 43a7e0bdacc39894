// Package accounts holds billing accounts (tenant, reseller, end customer) with their tax
// profile and invoice settings, the assignment of pricing plans to tenants, and the
// admin API over them (docs/billing-accounts.md).
package accounts

import (
	"context"

	"github.com/gantry-gpu/gantry/proto/api"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// Handlers is this feature's slice of the generated strict-server interface.
type Handlers struct{}

// NewHandlers returns the billing account handlers.
func NewHandlers() *Handlers { return &Handlers{} }

func notYet() error {
	return apierr.New(apierr.ServiceUnavailable, "not implemented yet").WithStatus(501)
}

// ListBillingAccounts implements GET /api/v1/admin/billing/accounts.
func (h *Handlers) ListBillingAccounts(context.Context, api.ListBillingAccountsRequestObject) (api.ListBillingAccountsResponseObject, error) {
	return nil, notYet()
}

// CreateBillingAccount implements POST /api/v1/admin/billing/accounts.
func (h *Handlers) CreateBillingAccount(context.Context, api.CreateBillingAccountRequestObject) (api.CreateBillingAccountResponseObject, error) {
	return nil, notYet()
}

// GetAdminBillingAccount implements GET /api/v1/admin/billing/accounts/{billing_account_id}.
func (h *Handlers) GetAdminBillingAccount(context.Context, api.GetAdminBillingAccountRequestObject) (api.GetAdminBillingAccountResponseObject, error) {
	return nil, notYet()
}

// UpdateBillingAccount implements PATCH /api/v1/admin/billing/accounts/{billing_account_id}.
func (h *Handlers) UpdateBillingAccount(context.Context, api.UpdateBillingAccountRequestObject) (api.UpdateBillingAccountResponseObject, error) {
	return nil, notYet()
}

// AssignTenantPricingPlan implements PUT /api/v1/admin/tenants/{tenant_id}/pricing-plan.
func (h *Handlers) AssignTenantPricingPlan(context.Context, api.AssignTenantPricingPlanRequestObject) (api.AssignTenantPricingPlanResponseObject, error) {
	return nil, notYet()
}
