package billing

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/cockroachdb/apd/v3"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/gantry-gpu/gantry/controlplane/internal/billing/billingdb"
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

// NewHandlers returns the billing handlers over svc.
func NewHandlers(svc *Service, cursors pagination.Codec) *Handlers {
	return &Handlers{Svc: svc, Cursors: cursors}
}

// tenantOf is the caller's tenant; billing reads need one.
func tenantOf(ctx context.Context) (*principal.Principal, uuid.UUID, error) {
	p, err := principal.Required(ctx)
	if err != nil {
		return nil, uuid.Nil, err
	}
	if p.TenantID == uuid.Nil {
		return nil, uuid.Nil, apierr.Forbidden("billing needs an organization; this account belongs to none").With("reason", "no_tenant")
	}
	return p, p.TenantID, nil
}

func apiMoney(m Money) api.Money { return api.Money{AmountMinor: m.AmountMinor, Currency: m.Currency} }

// GetBillingBalance implements GET /api/v1/billing/balance.
func (h *Handlers) GetBillingBalance(ctx context.Context, _ api.GetBillingBalanceRequestObject) (api.GetBillingBalanceResponseObject, error) {
	_, tenant, err := tenantOf(ctx)
	if err != nil {
		return nil, err
	}
	b, err := h.Svc.Balances(ctx, tenant)
	if err != nil {
		return nil, err
	}
	out := api.BillingBalanceResponse{Balance: apiMoney(b.Primary), Balances: make([]api.Money, 0, len(b.All))}
	for _, m := range b.All {
		out.Balances = append(out.Balances, apiMoney(m))
	}
	return api.GetBillingBalance200JSONResponse{Body: out}, nil
}

// GetBillingCurrencySettings implements GET /api/v1/billing/currency-settings.
func (h *Handlers) GetBillingCurrencySettings(ctx context.Context, _ api.GetBillingCurrencySettingsRequestObject) (api.GetBillingCurrencySettingsResponseObject, error) {
	_, tenant, err := tenantOf(ctx)
	if err != nil {
		return nil, err
	}
	cs, err := h.Svc.CurrencySettings(ctx, tenant)
	if err != nil {
		return nil, err
	}
	out := api.BillingCurrencySettingsResponse{TenantID: tenant, DefaultCurrency: cs.Default, SupportedCurrencies: cs.Supported}
	if cs.FX != nil {
		fx := apiFX(*cs.FX)
		out.FxSnapshot = &fx
	}
	return api.GetBillingCurrencySettings200JSONResponse{Body: out}, nil
}

func apiFX(s FXSnapshot) api.BillingFXSnapshot {
	return api.BillingFXSnapshot{SourceCurrency: s.SourceCurrency, TargetCurrency: s.TargetCurrency, Rate: s.Rate,
		Provider: s.Provider, ProviderRateID: s.ProviderRateID, CapturedAt: s.CapturedAt}
}

// GET /api/v1/billing/account is the accounts package's (controlplane/internal/billing/accounts).

type usageCursor struct {
	T  time.Time `json:"t,omitempty"`
	A  int64     `json:"a,omitempty"`
	ID uuid.UUID `json:"id"`
}

// ListBillingUsage implements GET /api/v1/billing/usage.
func (h *Handlers) ListBillingUsage(ctx context.Context, req api.ListBillingUsageRequestObject) (api.ListBillingUsageResponseObject, error) {
	_, tenant, err := tenantOf(ctx)
	if err != nil {
		return nil, err
	}
	sort := api.BillingUsageSortOrderStartTimeDesc
	if req.Params.Sort != nil {
		sort = *req.Params.Sort
	}
	from, to := time.Unix(0, 0).UTC(), time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)
	if req.Params.From != nil {
		from = *req.Params.From
	}
	if req.Params.To != nil {
		to = *req.Params.To
	}
	if !to.After(from) {
		return nil, apierr.Validation("to", "to must be after from").With("reason", "empty_range")
	}
	var after *usageCursor
	if req.Params.Cursor != nil {
		after = &usageCursor{}
		if err := h.Cursors.Decode(*req.Params.Cursor, string(sort), after); err != nil {
			return nil, err
		}
	}
	size := pagination.Size(req.Params.PageSize)
	lines, err := h.Svc.ListUsage(ctx, tenant, from, to, string(sort), after, size+1)
	if err != nil {
		return nil, err
	}
	out := api.BillingRatedUsageListResponse{Items: make([]api.BillingRatedUsageLine, 0, len(lines)), Pagination: api.Pagination{PageSize: size}}
	if len(lines) > size {
		lines = lines[:size]
		last := lines[size-1]
		c, err := h.Cursors.Encode(string(sort), usageCursor{T: last.BillFrom, A: last.AmountMinor, ID: last.ID})
		if err != nil {
			return nil, err
		}
		out.Pagination.NextCursor = &c
	}
	fx, err := h.Svc.fxByID(ctx, lines)
	if err != nil {
		return nil, err
	}
	for _, l := range lines {
		out.Items = append(out.Items, apiLine(l, fx))
	}
	return api.ListBillingUsage200JSONResponse{Body: out}, nil
}

func apiLine(l billingdb.BillingRatedUsageLine, fx map[uuid.UUID]FXSnapshot) api.BillingRatedUsageLine {
	exp := exponents[l.Currency]
	price, _, _ := apd.NewFromString(l.UnitPrice)
	var priceMinor int64
	if price != nil {
		priceMinor, _ = RoundMinor(price, exp)
	}
	snap := map[string]any{}
	_ = json.Unmarshal(l.PricingSnapshot, &snap)
	org := l.TenantID
	out := api.BillingRatedUsageLine{
		ID: l.ID, UsageRecordID: l.UsageRecordID, OrgID: &org, ProjectID: uuidPtr(l.ProjectID),
		RequestedByUserID: l.RequestedByUserID, UsageSource: api.BillingUsageSource(l.UsageSource), UsageUnit: l.UsageUnit,
		BillFrom: l.BillFrom, BillTo: l.BillTo, UnitQuantityMillis: l.UnitQuantityMillis,
		UnitPrice: api.Money{AmountMinor: priceMinor, Currency: l.Currency}, Units: l.Units,
		Amount: api.Money{AmountMinor: l.AmountMinor, Currency: l.Currency}, PricingSource: l.PricingSource,
		PricingPlanID: uuidPtr(l.PricingPlanID), PricingPlanVersion: l.PricingPlanVersion, PricingSnapshot: snap,
		RatingKey: l.RatingKey, LedgerEntryID: uuidPtr(l.LedgerEntryID), CreatedAt: l.CreatedAt,
	}
	if l.FxSnapshotID.Valid {
		if s, ok := fx[l.FxSnapshotID.UUID]; ok {
			v := apiFX(s)
			out.FxSnapshot = &v
		}
	}
	return out
}

func uuidPtr(n uuid.NullUUID) *uuid.UUID {
	if !n.Valid {
		return nil
	}
	v := n.UUID
	return &v
}

// RecordBillingFXSnapshot implements PUT /api/v1/admin/billing/fx-snapshots.
func (h *Handlers) RecordBillingFXSnapshot(ctx context.Context, req api.RecordBillingFXSnapshotRequestObject) (api.RecordBillingFXSnapshotResponseObject, error) {
	if _, err := principal.PlatformAdmin(ctx); err != nil {
		return nil, err
	}
	b := req.Body
	snap, created, err := h.Svc.RecordFXSnapshot(ctx, FXInput{
		Source: b.SourceCurrency, Target: b.TargetCurrency, Rate: b.Rate, Provider: b.Provider,
		ProviderRateID: b.ProviderRateID, CapturedAt: b.CapturedAt,
	})
	if err != nil {
		return nil, err
	}
	if created {
		return api.RecordBillingFXSnapshot201JSONResponse{Body: apiFX(snap)}, nil
	}
	return api.RecordBillingFXSnapshot200JSONResponse{Body: apiFX(snap)}, nil
}

// ShadowRateBilling implements POST /api/v1/admin/billing/shadow-rating.
func (h *Handlers) ShadowRateBilling(ctx context.Context, req api.ShadowRateBillingRequestObject) (api.ShadowRateBillingResponseObject, error) {
	if _, err := principal.PlatformAdmin(ctx); err != nil {
		return nil, err
	}
	b := req.Body
	cand := Money{AmountMinor: b.CandidateUnitPrice.AmountMinor, Currency: b.CandidateUnitPrice.Currency}
	lines, err := h.Svc.ShadowRate(ctx, b.OrgID, b.UsageRecordIds, cand)
	if err != nil {
		return nil, err
	}
	source := "shadow_rating"
	if b.PricingSource != nil {
		source = *b.PricingSource
	}
	snap := b.PricingSnapshot
	if snap == nil {
		snap = map[string]any{}
	}
	out := api.BillingShadowRatingResponse{Lines: make([]api.BillingShadowRatingLine, 0, len(lines))}
	var tot [3]int64
	for _, l := range lines {
		m := func(v int64) api.Money { return api.Money{AmountMinor: v, Currency: cand.Currency} }
		out.Lines = append(out.Lines, api.BillingShadowRatingLine{
			UsageRecordID: l.Record.ID, ExistingRatedAmount: m(l.Existing), CandidateRatedAmount: m(l.Candidate),
			DeltaAmount: m(l.Delta), CandidateRatingKey: l.CandidateKey, UsageSource: api.BillingUsageSource(l.Record.Source),
			UsageUnit: l.Record.UsageUnit, BillFrom: l.BillFrom, BillTo: l.BillTo, UnitQuantityMillis: l.QuantityMillis,
			UnitPrice: b.CandidateUnitPrice, Units: l.Units, PricingSource: source, PricingPlanID: b.PricingPlanID,
			PricingPlanVersion: b.PricingPlanVersion, PricingSnapshot: snap,
		})
		tot[0] += l.Existing
		tot[1] += l.Candidate
		tot[2] += l.Delta
	}
	out.Totals = api.BillingShadowRatingTotals{
		ExistingRatedAmount:  api.Money{AmountMinor: tot[0], Currency: cand.Currency},
		CandidateRatedAmount: api.Money{AmountMinor: tot[1], Currency: cand.Currency},
		DeltaAmount:          api.Money{AmountMinor: tot[2], Currency: cand.Currency},
	}
	return api.ShadowRateBilling200JSONResponse{Body: out}, nil
}

// CreateBillingAdjustment implements POST /api/v1/admin/billing/adjustments.
func (h *Handlers) CreateBillingAdjustment(ctx context.Context, req api.CreateBillingAdjustmentRequestObject) (api.CreateBillingAdjustmentResponseObject, error) {
	p, err := principal.PlatformAdmin(ctx)
	if err != nil {
		return nil, err
	}
	b := req.Body
	m := Money{AmountMinor: b.Amount.AmountMinor, Currency: b.Amount.Currency}
	posted, err := h.Svc.Adjust(ctx, Adjustment{TenantID: b.TenantID, Money: m, Reason: b.Reason, ActorID: p.UserID})
	if err != nil {
		return nil, err
	}
	bal, err := h.Svc.WalletBalance(ctx, b.TenantID, m.Currency)
	if err != nil {
		return nil, err
	}
	return api.CreateBillingAdjustment201JSONResponse{Body: api.BillingAdjustmentResponse{
		LedgerTransactionID: posted.TxnID, TenantID: b.TenantID, Amount: b.Amount,
		Balance: api.Money{AmountMinor: bal, Currency: m.Currency},
	}}, nil
}

// ReverseBillingLedgerTransaction implements POST
// /api/v1/admin/billing/ledger-transactions/{transaction_id}/reversal.
func (h *Handlers) ReverseBillingLedgerTransaction(ctx context.Context, req api.ReverseBillingLedgerTransactionRequestObject) (api.ReverseBillingLedgerTransactionResponseObject, error) {
	p, err := principal.PlatformAdmin(ctx)
	if err != nil {
		return nil, err
	}
	posted, err := h.Svc.ReverseTransaction(ctx, req.TransactionID, req.Body.Reason, p.UserID)
	if err != nil {
		return nil, err
	}
	return api.ReverseBillingLedgerTransaction201JSONResponse{Body: api.BillingLedgerReversalResponse{
		ReversalTransactionID: posted.TxnID, ReversedTransactionID: req.TransactionID,
	}}, nil
}

func apiPlan(p Plan) api.BillingPricingPlan {
	out := api.BillingPricingPlan{ID: p.ID, Name: p.Name, IsDefault: p.IsDefault, CreatedAt: p.CreatedAt,
		Versions: make([]api.BillingPricingPlanVersion, 0, len(p.Versions))}
	for _, v := range p.Versions {
		av := api.BillingPricingPlanVersion{Version: v.Version, EffectiveFrom: v.EffectiveFrom, CreatedAt: v.CreatedAt,
			Prices: make([]api.BillingPrice, 0, len(v.Prices))}
		for _, pr := range v.Prices {
			av.Prices = append(av.Prices, api.BillingPrice{UsageUnit: pr.Unit, Currency: pr.Currency, UnitPrice: pr.UnitPrice})
		}
		out.Versions = append(out.Versions, av)
	}
	return out
}

func priceInputs(in []api.BillingPrice) []PriceInput {
	out := make([]PriceInput, len(in))
	for i, p := range in {
		out[i] = PriceInput{Unit: p.UsageUnit, Currency: p.Currency, UnitPrice: p.UnitPrice}
	}
	return out
}

// ListBillingPricingPlans implements GET /api/v1/admin/billing/pricing-plans.
func (h *Handlers) ListBillingPricingPlans(ctx context.Context, _ api.ListBillingPricingPlansRequestObject) (api.ListBillingPricingPlansResponseObject, error) {
	if _, err := principal.PlatformAdmin(ctx); err != nil {
		return nil, err
	}
	plans, err := h.Svc.ListPlans(ctx)
	if err != nil {
		return nil, err
	}
	out := api.BillingPricingPlanListResponse{Items: make([]api.BillingPricingPlan, 0, len(plans))}
	for _, p := range plans {
		out.Items = append(out.Items, apiPlan(p))
	}
	return api.ListBillingPricingPlans200JSONResponse{Body: out}, nil
}

// CreateBillingPricingPlan implements POST /api/v1/admin/billing/pricing-plans.
func (h *Handlers) CreateBillingPricingPlan(ctx context.Context, req api.CreateBillingPricingPlanRequestObject) (api.CreateBillingPricingPlanResponseObject, error) {
	if _, err := principal.PlatformAdmin(ctx); err != nil {
		return nil, err
	}
	b := req.Body
	p, err := h.Svc.CreatePlan(ctx, b.Name, b.IsDefault != nil && *b.IsDefault, b.EffectiveFrom, priceInputs(b.Prices))
	if err != nil {
		return nil, err
	}
	return api.CreateBillingPricingPlan201JSONResponse{Body: apiPlan(p)}, nil
}

// CreateBillingPricingPlanVersion implements POST
// /api/v1/admin/billing/pricing-plans/{plan_id}/versions.
func (h *Handlers) CreateBillingPricingPlanVersion(ctx context.Context, req api.CreateBillingPricingPlanVersionRequestObject) (api.CreateBillingPricingPlanVersionResponseObject, error) {
	if _, err := principal.PlatformAdmin(ctx); err != nil {
		return nil, err
	}
	p, err := h.Svc.NewPlanVersion(ctx, req.PlanID, req.Body.EffectiveFrom, priceInputs(req.Body.Prices))
	if err != nil {
		return nil, err
	}
	return api.CreateBillingPricingPlanVersion201JSONResponse{Body: apiPlan(p)}, nil
}

// CurrencySettingsView is a tenant's currency settings.
type CurrencySettingsView struct {
	Default   string
	Supported []string
	FX        *FXSnapshot
}

// CurrencySettings: the tenant default currency; supported = the default, then every
// currency the tenant holds a wallet in, then those its pricing plan prices in; the
// latest FX snapshot from the default currency (nil when none).
func (s *Service) CurrencySettings(ctx context.Context, tenantID uuid.UUID) (CurrencySettingsView, error) {
	q := s.read(ctx)
	def, err := q.TenantDefaultCurrency(ctx, tenantID)
	if err != nil {
		return CurrencySettingsView{}, err
	}
	out := CurrencySettingsView{Default: def, Supported: []string{def}}
	add := func(c string) {
		for _, x := range out.Supported {
			if x == c {
				return
			}
		}
		if len(out.Supported) < 64 {
			out.Supported = append(out.Supported, c)
		}
	}
	wallets, err := q.TenantWallets(ctx, nullUUID(tenantID))
	if err != nil {
		return out, err
	}
	for _, w := range wallets {
		add(w.Currency)
	}
	if sc, err := newPricer(q).forTenant(ctx, tenantID); err == nil {
		for _, prices := range sc.prices {
			for k := range prices {
				add(k[len(k)-3:])
			}
		}
	} else if !errors.Is(err, ErrNoPrice) {
		return out, err
	}
	fx, err := q.LatestFXFrom(ctx, def)
	if err == nil {
		out.FX = &fx
	} else if !errors.Is(err, pgx.ErrNoRows) {
		return out, err
	}
	return out, nil
}

// AccountView is a tenant's billing account (reseller fields are not modelled yet).
type AccountView struct {
	ID              *uuid.UUID
	Type, Status    string
	Name            string
	DefaultCurrency string
	PricingPlanID   *uuid.UUID
}

// Account loads the tenant's billing account; without a stored row it is the implicit
// tenant account (id null, active).
func (s *Service) Account(ctx context.Context, tenantID uuid.UUID) (AccountView, error) {
	q := s.read(ctx)
	t, err := q.TenantName(ctx, tenantID)
	if err != nil {
		return AccountView{}, err
	}
	out := AccountView{Type: "tenant", Status: "active", Name: t.Name, DefaultCurrency: t.DefaultCurrency}
	a, err := q.GetBillingAccount(ctx, tenantID)
	if errors.Is(err, pgx.ErrNoRows) {
		return out, nil
	}
	if err != nil {
		return out, err
	}
	out.ID, out.Type, out.Status, out.PricingPlanID = &a.ID, a.AccountType, a.Status, uuidPtr(a.CustomerPricingPlanID)
	return out, nil
}

// ListUsage is a page of the tenant's rated lines with bill_from in [from, to).
func (s *Service) ListUsage(ctx context.Context, tenantID uuid.UUID, from, to time.Time, sort string, after *usageCursor, limit int) ([]billingdb.BillingRatedUsageLine, error) {
	q := s.read(ctx)
	var a usageCursor
	if after != nil {
		a = *after
	}
	lim := int32(limit)
	switch api.BillingUsageSortOrder(sort) {
	case api.BillingUsageSortOrderStartTimeAsc:
		return q.ListLinesStartAsc(ctx, billingdb.ListLinesStartAscParams{TenantID: tenantID, FromTime: from, ToTime: to,
			HasAfter: after != nil, AfterTime: a.T, AfterID: a.ID, Lim: lim})
	case api.BillingUsageSortOrderCostDesc:
		return q.ListLinesCostDesc(ctx, billingdb.ListLinesCostDescParams{TenantID: tenantID, FromTime: from, ToTime: to,
			HasAfter: after != nil, AfterAmount: a.A, AfterID: a.ID, Lim: lim})
	case api.BillingUsageSortOrderCostAsc:
		return q.ListLinesCostAsc(ctx, billingdb.ListLinesCostAscParams{TenantID: tenantID, FromTime: from, ToTime: to,
			HasAfter: after != nil, AfterAmount: a.A, AfterID: a.ID, Lim: lim})
	default:
		return q.ListLinesStartDesc(ctx, billingdb.ListLinesStartDescParams{TenantID: tenantID, FromTime: from, ToTime: to,
			HasAfter: after != nil, AfterTime: a.T, AfterID: a.ID, Lim: lim})
	}
}

func (s *Service) fxByID(ctx context.Context, lines []billingdb.BillingRatedUsageLine) (map[uuid.UUID]FXSnapshot, error) {
	var ids []uuid.UUID
	for _, l := range lines {
		if l.FxSnapshotID.Valid {
			ids = append(ids, l.FxSnapshotID.UUID)
		}
	}
	out := map[uuid.UUID]FXSnapshot{}
	if len(ids) == 0 {
		return out, nil
	}
	rows, err := s.read(ctx).FXSnapshotsByID(ctx, ids)
	for _, r := range rows {
		out[r.ID] = r
	}
	return out, err
}
