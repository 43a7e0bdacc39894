package accounts

import (
	"context"
	"time"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/pagination"
	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/proto/api"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// Handlers is this feature's slice of the generated strict-server interface.
type Handlers struct {
	Svc     *Service
	Cursors pagination.Codec
}

// NewHandlers returns the billing account handlers over svc.
func NewHandlers(svc *Service, cursors pagination.Codec) *Handlers {
	return &Handlers{Svc: svc, Cursors: cursors}
}

func taxFromAPI(p *api.BillingTaxProfile) *TaxProfile {
	if p == nil {
		return nil
	}
	out := &TaxProfile{Treatment: string(p.Treatment), Jurisdiction: p.Jurisdiction, SellerRegistration: p.SellerTaxRegistration,
		CustomerRegistration: p.CustomerTaxRegistration, DefaultRateBps: p.DefaultTaxRateBps, ExemptReason: p.TaxExemptReason,
		Evidence: p.TaxEvidence}
	for _, r := range p.TaxRates {
		out.Rates = append(out.Rates, TaxRate{Category: r.TaxCategory, RateBps: r.TaxRateBps})
	}
	return out
}

func settingsFromAPI(s *api.BillingInvoiceSettings) *InvoiceSettings {
	if s == nil {
		return nil
	}
	return &InvoiceSettings{Currency: s.Currency, Period: string(s.Period), PaymentTermsDays: s.PaymentTermsDays}
}

func strPtr[T ~string](v *T) *string {
	if v == nil {
		return nil
	}
	s := string(*v)
	return &s
}

// apiAdmin is the admin view of a.
func apiAdmin(a Account) api.BillingAccountAdminResponse {
	tp := api.BillingTaxProfile{Treatment: api.BillingTaxTreatment(a.Tax.Treatment), Jurisdiction: a.Tax.Jurisdiction,
		SellerTaxRegistration: a.Tax.SellerRegistration, CustomerTaxRegistration: a.Tax.CustomerRegistration,
		DefaultTaxRateBps: a.Tax.DefaultRateBps, TaxExemptReason: a.Tax.ExemptReason, TaxEvidence: a.Tax.Evidence}
	for _, r := range a.Tax.Rates {
		tp.TaxRates = append(tp.TaxRates, api.BillingTaxRate{TaxCategory: r.Category, TaxRateBps: r.RateBps})
	}
	out := api.BillingAccountAdminResponse{
		BillingAccountID: a.ID, TenantID: a.TenantID, AccountType: api.BillingAccountType(a.Type), Name: a.Name, DisplayName: a.Name,
		ParentBillingAccountID: a.ParentID, ResellerTenantID: a.ResellerTenantID, InvoiceRecipientTenantID: a.InvoiceRecipientTenantID,
		DefaultCurrency: a.DefaultCurrency, WholesalePricingPlanID: a.WholesalePlanID, CustomerPricingPlanID: a.CustomerPlanID,
		TaxResponsibility: api.BillingTaxResponsibility(a.TaxResponsibility), CreditRiskOwner: api.BillingCreditRiskOwner(a.CreditRiskOwner),
		Status: api.BillingAccountStatus(a.Status), TaxProfile: tp,
		InvoiceSettings: api.BillingInvoiceSettings{Currency: a.Invoice.Currency, Period: api.BillingInvoicePeriod(a.Invoice.Period),
			PaymentTermsDays: a.Invoice.PaymentTermsDays},
		Arrears: make([]api.Money, 0, len(a.Arrears)), CreatedAt: a.CreatedAt, UpdatedAt: a.UpdatedAt,
	}
	for _, m := range a.Arrears {
		out.Arrears = append(out.Arrears, api.Money{AmountMinor: m.AmountMinor, Currency: m.Currency})
	}
	return out
}

// GetBillingAccount implements GET /api/v1/billing/account: the caller's tenant's
// account. An end customer never sees the wholesale plan its reseller pays.
func (h *Handlers) GetBillingAccount(ctx context.Context, _ api.GetBillingAccountRequestObject) (api.GetBillingAccountResponseObject, error) {
	p, err := principal.Required(ctx)
	if err != nil {
		return nil, err
	}
	if p.TenantID == uuid.Nil {
		return nil, apierr.Forbidden("billing needs an organization; this account belongs to none").With("reason", "no_tenant")
	}
	a, ok, err := h.Svc.ForTenant(ctx, p.TenantID)
	if err != nil {
		return nil, err
	}
	if !ok {
		// No account row yet: the implicit tenant account (billing_account_id null).
		var name, cur string
		if err := h.Svc.Pool.QueryRow(ctx, `SELECT name, default_currency FROM tenants WHERE id = $1`, p.TenantID).Scan(&name, &cur); err != nil {
			return nil, err
		}
		return api.GetBillingAccount200JSONResponse{Body: api.BillingAccountResponse{
			TenantID: p.TenantID, AccountType: api.BillingAccountTypeTenant, Name: name, DisplayName: name, DefaultCurrency: cur,
			TaxResponsibility: api.BillingAccountResponseTaxResponsibilityPlatform,
			CreditRiskOwner:   api.BillingAccountResponseCreditRiskOwnerPlatform, Status: api.BillingAccountResponseStatusActive,
		}}, nil
	}
	id := a.ID
	out := api.BillingAccountResponse{
		BillingAccountID: &id, TenantID: a.TenantID, AccountType: api.BillingAccountType(a.Type), Name: a.Name, DisplayName: a.Name,
		ParentBillingAccountID: a.ParentID, ResellerTenantID: a.ResellerTenantID, InvoiceRecipientTenantID: a.InvoiceRecipientTenantID,
		DefaultCurrency: a.DefaultCurrency, CustomerPricingPlanID: a.CustomerPlanID,
		TaxResponsibility: api.BillingAccountResponseTaxResponsibility(a.TaxResponsibility),
		CreditRiskOwner:   api.BillingAccountResponseCreditRiskOwner(a.CreditRiskOwner),
		Status:            api.BillingAccountResponseStatus(a.Status),
	}
	return api.GetBillingAccount200JSONResponse{Body: out}, nil
}

type accountCursor struct {
	T  time.Time `json:"t"`
	ID uuid.UUID `json:"id"`
}

const cursorScope = "billing_accounts"

// ListBillingAccounts implements GET /api/v1/admin/billing/accounts.
func (h *Handlers) ListBillingAccounts(ctx context.Context, req api.ListBillingAccountsRequestObject) (api.ListBillingAccountsResponseObject, error) {
	if _, err := principal.PlatformAdmin(ctx); err != nil {
		return nil, err
	}
	f := ListFilter{Limit: pagination.Size(req.Params.PageSize)}
	if req.Params.AccountType != nil {
		f.Type = string(*req.Params.AccountType)
	}
	if req.Params.Status != nil {
		f.Status = string(*req.Params.Status)
	}
	if req.Params.ResellerTenantID != nil {
		f.ResellerTenantID = *req.Params.ResellerTenantID
	}
	if req.Params.Cursor != nil {
		var c accountCursor
		if err := h.Cursors.Decode(*req.Params.Cursor, cursorScope, &c); err != nil {
			return nil, err
		}
		f.AfterCreated, f.AfterID = c.T, c.ID
	}
	size := f.Limit
	f.Limit = size + 1
	accts, err := h.Svc.List(ctx, f)
	if err != nil {
		return nil, err
	}
	out := api.BillingAccountListResponse{Items: make([]api.BillingAccountAdminResponse, 0, len(accts)), Pagination: api.Pagination{PageSize: size}}
	if len(accts) > size {
		accts = accts[:size]
		last := accts[size-1]
		c, err := h.Cursors.Encode(cursorScope, accountCursor{T: last.CreatedAt, ID: last.ID})
		if err != nil {
			return nil, err
		}
		out.Pagination.NextCursor = &c
	}
	for _, a := range accts {
		out.Items = append(out.Items, apiAdmin(a))
	}
	return api.ListBillingAccounts200JSONResponse{Body: out}, nil
}

// CreateBillingAccount implements POST /api/v1/admin/billing/accounts.
func (h *Handlers) CreateBillingAccount(ctx context.Context, req api.CreateBillingAccountRequestObject) (api.CreateBillingAccountResponseObject, error) {
	p, err := principal.PlatformAdmin(ctx)
	if err != nil {
		return nil, err
	}
	b := req.Body
	a, err := h.Svc.Create(ctx, Create{
		TenantID: b.TenantID, Type: string(b.AccountType), Name: b.Name, ParentID: b.ParentBillingAccountID,
		InvoiceRecipientTenantID: b.InvoiceRecipientTenantID, DefaultCurrency: b.DefaultCurrency,
		WholesalePlanID: b.WholesalePricingPlanID, CustomerPlanID: b.CustomerPricingPlanID,
		TaxResponsibility: strPtr(b.TaxResponsibility), CreditRiskOwner: strPtr(b.CreditRiskOwner),
		Tax: taxFromAPI(b.TaxProfile), Invoice: settingsFromAPI(b.InvoiceSettings), ActorID: p.UserID,
	})
	if err != nil {
		return nil, err
	}
	return api.CreateBillingAccount201JSONResponse{Body: apiAdmin(a)}, nil
}

// GetAdminBillingAccount implements GET /api/v1/admin/billing/accounts/{billing_account_id}.
func (h *Handlers) GetAdminBillingAccount(ctx context.Context, req api.GetAdminBillingAccountRequestObject) (api.GetAdminBillingAccountResponseObject, error) {
	if _, err := principal.PlatformAdmin(ctx); err != nil {
		return nil, err
	}
	a, err := h.Svc.Get(ctx, req.BillingAccountID)
	if err != nil {
		return nil, err
	}
	return api.GetAdminBillingAccount200JSONResponse{Body: apiAdmin(a)}, nil
}

// UpdateBillingAccount implements PATCH /api/v1/admin/billing/accounts/{billing_account_id}.
func (h *Handlers) UpdateBillingAccount(ctx context.Context, req api.UpdateBillingAccountRequestObject) (api.UpdateBillingAccountResponseObject, error) {
	p, err := principal.PlatformAdmin(ctx)
	if err != nil {
		return nil, err
	}
	b := req.Body
	a, err := h.Svc.Update(ctx, req.BillingAccountID, Update{
		Name: b.Name, InvoiceRecipientTenantID: b.InvoiceRecipientTenantID, WholesalePlanID: b.WholesalePricingPlanID,
		CustomerPlanID: b.CustomerPricingPlanID, TaxResponsibility: strPtr(b.TaxResponsibility), CreditRiskOwner: strPtr(b.CreditRiskOwner),
		Status: strPtr(b.Status), Tax: taxFromAPI(b.TaxProfile), Invoice: settingsFromAPI(b.InvoiceSettings), ActorID: p.UserID,
	})
	if err != nil {
		return nil, err
	}
	return api.UpdateBillingAccount200JSONResponse{Body: apiAdmin(a)}, nil
}

// AssignTenantPricingPlan implements PUT /api/v1/admin/tenants/{tenant_id}/pricing-plan.
func (h *Handlers) AssignTenantPricingPlan(ctx context.Context, req api.AssignTenantPricingPlanRequestObject) (api.AssignTenantPricingPlanResponseObject, error) {
	p, err := principal.PlatformAdmin(ctx)
	if err != nil {
		return nil, err
	}
	a, err := h.Svc.AssignPlan(ctx, req.TenantID, req.Body.PricingPlanID, p.UserID)
	if err != nil {
		return nil, err
	}
	return api.AssignTenantPricingPlan200JSONResponse{Body: apiAdmin(a)}, nil
}
