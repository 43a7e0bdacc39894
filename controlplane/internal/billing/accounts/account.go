package accounts

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/gantry-gpu/gantry/controlplane/internal/audit"
	"github.com/gantry-gpu/gantry/controlplane/internal/billing"
	"github.com/gantry-gpu/gantry/controlplane/internal/billing/invoices"
	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/shared/apierr"
	"github.com/gantry-gpu/gantry/shared/clock"
	"github.com/gantry-gpu/gantry/shared/ids"
)

// Account types, statuses and parties (seed §2.2 BillingAccountResponse, §3).
const (
	TypeTenant      = "tenant"
	TypeReseller    = "reseller"
	TypeEndCustomer = "end_customer"

	StatusActive   = "active"
	StatusDisabled = "disabled"
	StatusDeleted  = "deleted"

	PartyPlatform    = "platform"
	PartyReseller    = "reseller"
	PartyEndCustomer = "end_customer"
)

// TaxRate is the standard rate of one tax category.
type TaxRate struct {
	Category string `json:"tax_category"`
	RateBps  int    `json:"tax_rate_bps"`
}

// TaxProfile says how the account's invoices are taxed.
type TaxProfile struct {
	Treatment            string
	Jurisdiction         *string
	SellerRegistration   *string
	CustomerRegistration *string
	Rates                []TaxRate
	DefaultRateBps       *int
	ExemptReason         *string
	Evidence             map[string]any
}

// InvoiceSettings are the account's invoice currency, period and payment terms.
type InvoiceSettings struct {
	Currency         string
	Period           string
	PaymentTermsDays int
}

// Account is a billing account with every seed §2.2 field, its tax profile and invoice
// settings.
type Account struct {
	ID                       uuid.UUID
	TenantID                 uuid.UUID
	Type                     string
	Name                     string
	ParentID                 *uuid.UUID
	ResellerTenantID         *uuid.UUID
	InvoiceRecipientTenantID *uuid.UUID
	DefaultCurrency          string
	WholesalePlanID          *uuid.UUID
	CustomerPlanID           *uuid.UUID
	TaxResponsibility        string
	CreditRiskOwner          string
	Status                   string
	Tax                      TaxProfile
	Invoice                  InvoiceSettings
	// Arrears is what the tenant's receivable owes per currency (positive amounts).
	Arrears   []billing.Money
	CreatedAt time.Time
	UpdatedAt time.Time
}

// Service manages billing accounts.
type Service struct {
	Pool  *pgxpool.Pool
	Clock clock.Clock
	IDs   ids.Source
	Audit *audit.Log
	// SellerName is the platform's name on the invoices it issues.
	SellerName string
}

// New returns the service.
func New(pool *pgxpool.Pool, clk clock.Clock, idSrc ids.Source) *Service {
	return &Service{Pool: pool, Clock: clk, IDs: idSrc, Audit: &audit.Log{Clock: clk, IDs: idSrc}, SellerName: "Gantry"}
}

var jurisdictionPattern = regexp.MustCompile(`^[A-Z]{2}(-[A-Z0-9]{1,3})?$`)
var categoryPattern = regexp.MustCompile(`^[a-z0-9][a-z0-9._:-]{0,63}$`)

func notFound(what, field string) *apierr.Error {
	return apierr.New(apierr.InvalidRequest, "%s not found", what).WithStatus(404).With("reason", "not_found").With("field", field)
}

func conflict(reason, format string, args ...any) *apierr.Error {
	return apierr.New(apierr.InvalidRequest, format, args...).WithStatus(409).With("reason", reason)
}

func invalid(field, reason, format string, args ...any) *apierr.Error {
	return apierr.Validation(field, "%s", fmt.Sprintf(format, args...)).With("reason", reason)
}

// invoiceProfile is the profile as the invoice builder applies it.
func (p TaxProfile) invoiceProfile() invoices.TaxProfile {
	out := invoices.TaxProfile{Treatment: p.Treatment, Jurisdiction: p.Jurisdiction, SellerRegistration: p.SellerRegistration,
		CustomerRegistration: p.CustomerRegistration, DefaultRateBps: p.DefaultRateBps, ExemptReason: p.ExemptReason, Evidence: p.Evidence}
	if len(p.Rates) > 0 {
		out.Rates = make(map[string]int, len(p.Rates))
		for _, r := range p.Rates {
			out.Rates[r.Category] = r.RateBps
		}
	}
	return out
}

// Validate refuses a profile an invoice could not be built with: the invoice builder's
// own rules (reverse charge needs the customer's registration and evidence, exemption
// needs evidence and a reason, rates within 0..10000) plus a jurisdiction for standard
// tax and distinct categories.
func (p TaxProfile) Validate() error {
	if p.Jurisdiction != nil && !jurisdictionPattern.MatchString(*p.Jurisdiction) {
		return invalid("tax_profile.jurisdiction", "malformed_jurisdiction", "jurisdiction must match %s", jurisdictionPattern)
	}
	seen := map[string]bool{}
	for i, r := range p.Rates {
		if !categoryPattern.MatchString(r.Category) {
			return invalid(fmt.Sprintf("tax_profile.tax_rates[%d].tax_category", i), "malformed_tax_category", "tax_category must match %s", categoryPattern)
		}
		if r.RateBps < 0 || r.RateBps > invoices.MaxRateBps {
			return invalid(fmt.Sprintf("tax_profile.tax_rates[%d].tax_rate_bps", i), "tax_rate_out_of_range", "tax_rate_bps %d is outside 0..%d", r.RateBps, invoices.MaxRateBps)
		}
		if seen[r.Category] {
			return invalid(fmt.Sprintf("tax_profile.tax_rates[%d].tax_category", i), "duplicate_tax_category", "tax category %q appears twice", r.Category)
		}
		seen[r.Category] = true
	}
	if p.Treatment == invoices.TreatmentStandard && (p.Jurisdiction == nil || *p.Jurisdiction == "") {
		return invalid("tax_profile.jurisdiction", "jurisdiction_required", "standard tax needs a jurisdiction")
	}
	if err := p.invoiceProfile().Validate(); err != nil {
		var ae *apierr.Error
		if errors.As(err, &ae) {
			if f, ok := ae.Details["field"].(string); ok && !strings.HasPrefix(f, "tax_profile.") {
				ae.Details["field"] = "tax_profile." + f
			}
		}
		return err
	}
	return nil
}

func checkCurrency(field, c string) error {
	if _, ok := billing.Exponent(c); !ok {
		return invalid(field, "unsupported_currency", "currency %q is not supported", c)
	}
	return nil
}

func validSettings(s InvoiceSettings) error {
	if err := checkCurrency("invoice_settings.currency", s.Currency); err != nil {
		return err
	}
	if s.Period != "monthly" {
		return invalid("invoice_settings.period", "unsupported_period", "period must be monthly")
	}
	if s.PaymentTermsDays < 0 || s.PaymentTermsDays > 365 {
		return invalid("invoice_settings.payment_terms_days", "out_of_range", "payment_terms_days is 0..365")
	}
	return nil
}

const selectAccount = `SELECT a.id, a.tenant_id, a.account_type, COALESCE(a.name, t.name), a.parent_billing_account_id,
	a.reseller_tenant_id, a.invoice_recipient_tenant_id, COALESCE(a.default_currency, t.default_currency),
	a.wholesale_pricing_plan_id, a.customer_pricing_plan_id, a.tax_responsibility, a.credit_risk_owner, a.status,
	a.tax_treatment, a.tax_jurisdiction, a.seller_tax_registration, a.customer_tax_registration, a.tax_rates,
	a.default_tax_rate_bps, a.tax_exempt_reason, a.tax_evidence,
	COALESCE(a.invoice_currency, a.default_currency, t.default_currency), a.invoice_period, a.payment_terms_days,
	a.created_at, a.updated_at
	FROM billing_accounts a JOIN tenants t ON t.id = a.tenant_id`

type scanner interface{ Scan(...any) error }

// querier is a pool or a transaction.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

func scanAccount(r scanner) (Account, error) {
	var a Account
	var rates, evidence []byte
	var parent, reseller, recipient, wholesale, customer uuid.NullUUID
	err := r.Scan(&a.ID, &a.TenantID, &a.Type, &a.Name, &parent, &reseller, &recipient, &a.DefaultCurrency,
		&wholesale, &customer, &a.TaxResponsibility, &a.CreditRiskOwner, &a.Status,
		&a.Tax.Treatment, &a.Tax.Jurisdiction, &a.Tax.SellerRegistration, &a.Tax.CustomerRegistration, &rates,
		&a.Tax.DefaultRateBps, &a.Tax.ExemptReason, &evidence,
		&a.Invoice.Currency, &a.Invoice.Period, &a.Invoice.PaymentTermsDays, &a.CreatedAt, &a.UpdatedAt)
	if err != nil {
		return a, err
	}
	a.ParentID, a.ResellerTenantID, a.InvoiceRecipientTenantID = ptr(parent), ptr(reseller), ptr(recipient)
	a.WholesalePlanID, a.CustomerPlanID = ptr(wholesale), ptr(customer)
	if err := json.Unmarshal(rates, &a.Tax.Rates); err != nil {
		return a, fmt.Errorf("tax rates: %w", err)
	}
	if err := json.Unmarshal(evidence, &a.Tax.Evidence); err != nil {
		return a, fmt.Errorf("tax evidence: %w", err)
	}
	return a, nil
}

func ptr(n uuid.NullUUID) *uuid.UUID {
	if !n.Valid {
		return nil
	}
	v := n.UUID
	return &v
}

func null(p *uuid.UUID) uuid.NullUUID {
	if p == nil {
		return uuid.NullUUID{}
	}
	return uuid.NullUUID{UUID: *p, Valid: true}
}

// arrears fills a.Arrears from the tenant's receivables.
func arrears(ctx context.Context, q querier, accts []Account) error {
	if len(accts) == 0 {
		return nil
	}
	tenants := make([]uuid.UUID, len(accts))
	for i, a := range accts {
		tenants[i] = a.TenantID
	}
	rows, err := q.Query(ctx, `SELECT tenant_id, currency, -balance_minor FROM billing_ledger_accounts
		WHERE kind = 'tenant_receivable' AND tenant_id = ANY($1) AND balance_minor < 0 ORDER BY currency`, tenants)
	if err != nil {
		return fmt.Errorf("arrears: %w", err)
	}
	defer rows.Close()
	by := map[uuid.UUID][]billing.Money{}
	for rows.Next() {
		var t uuid.UUID
		var m billing.Money
		if err := rows.Scan(&t, &m.Currency, &m.AmountMinor); err != nil {
			return err
		}
		by[t] = append(by[t], m)
	}
	if err := rows.Err(); err != nil {
		return err
	}
	for i := range accts {
		accts[i].Arrears = by[accts[i].TenantID]
	}
	return nil
}

func (s *Service) get(ctx context.Context, q querier, where string, arg any, lock bool) (Account, error) {
	sql := selectAccount + " WHERE " + where
	if lock {
		sql += " FOR UPDATE OF a"
	}
	a, err := scanAccount(q.QueryRow(ctx, sql, arg))
	if err != nil {
		return a, err
	}
	out := []Account{a}
	if err := arrears(ctx, q, out); err != nil {
		return a, err
	}
	return out[0], nil
}

// Get is the account with id.
func (s *Service) Get(ctx context.Context, id uuid.UUID) (Account, error) {
	a, err := s.get(ctx, s.Pool, "a.id = $1", id, false)
	if errors.Is(err, pgx.ErrNoRows) {
		return a, notFound("billing account", "billing_account_id")
	}
	return a, err
}

// ForTenant is the tenant's billing account; ok is false when the tenant has none (its
// usage is then billed like a plain tenant account's).
func (s *Service) ForTenant(ctx context.Context, tenantID uuid.UUID) (Account, bool, error) {
	a, err := s.get(ctx, s.Pool, "a.tenant_id = $1", tenantID, false)
	if errors.Is(err, pgx.ErrNoRows) {
		return a, false, nil
	}
	return a, err == nil, err
}

// ListFilter narrows List.
type ListFilter struct {
	Type, Status     string
	ResellerTenantID uuid.UUID
	AfterCreated     time.Time
	AfterID          uuid.UUID
	Limit            int
}

// List is a page of accounts, oldest first. Deleted accounts appear only when asked for.
func (s *Service) List(ctx context.Context, f ListFilter) ([]Account, error) {
	conds := []string{"($1 = '' OR a.account_type = $1)",
		"(($2 = '' AND a.status <> 'deleted') OR a.status = $2)",
		"($3::uuid IS NULL OR a.reseller_tenant_id = $3)",
		"($4::uuid IS NULL OR (a.created_at, a.id) > ($5, $4))"}
	rows, err := s.Pool.Query(ctx, selectAccount+" WHERE "+strings.Join(conds, " AND ")+" ORDER BY a.created_at, a.id LIMIT $6",
		f.Type, f.Status, uuid.NullUUID{UUID: f.ResellerTenantID, Valid: f.ResellerTenantID != uuid.Nil},
		uuid.NullUUID{UUID: f.AfterID, Valid: f.AfterID != uuid.Nil}, f.AfterCreated, f.Limit)
	if err != nil {
		return nil, fmt.Errorf("list accounts: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Account, error) { return scanAccount(r) })
	if err != nil {
		return nil, fmt.Errorf("list accounts: %w", err)
	}
	return out, arrears(ctx, s.Pool, out)
}

// Create is what a new account says; nil fields take their defaults.
type Create struct {
	TenantID                 uuid.UUID
	Type                     string
	Name                     string
	ParentID                 *uuid.UUID
	InvoiceRecipientTenantID *uuid.UUID
	DefaultCurrency          *string
	WholesalePlanID          *uuid.UUID
	CustomerPlanID           *uuid.UUID
	TaxResponsibility        *string
	CreditRiskOwner          *string
	Tax                      *TaxProfile
	Invoice                  *InvoiceSettings
	ActorID                  uuid.UUID
}

func tenantCurrency(ctx context.Context, tx pgx.Tx, tenantID uuid.UUID, field string) (string, error) {
	var cur string
	err := tx.QueryRow(ctx, `SELECT default_currency FROM tenants WHERE id = $1`, tenantID).Scan(&cur)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", notFound("tenant", field)
	}
	return cur, err
}

func planExists(ctx context.Context, tx pgx.Tx, id *uuid.UUID, field string) error {
	if id == nil {
		return nil
	}
	var ok bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM billing_pricing_plans WHERE id = $1)`, *id).Scan(&ok); err != nil {
		return fmt.Errorf("pricing plan: %w", err)
	}
	if !ok {
		return notFound("pricing plan", field)
	}
	return nil
}

// check validates the relations and parties of a (new or changed) account.
func check(a *Account) error {
	if n := len([]rune(a.Name)); n < 1 || n > 120 {
		return invalid("name", "name_length", "name has 1 to 120 characters")
	}
	if a.Type != TypeEndCustomer {
		if a.WholesalePlanID != nil {
			return invalid("wholesale_pricing_plan_id", "wholesale_plan_not_end_customer", "only an end_customer account is rated at a wholesale plan")
		}
		if a.CreditRiskOwner == PartyReseller {
			return invalid("credit_risk_owner", "no_reseller", "credit_risk_owner reseller needs an end_customer account")
		}
		if a.TaxResponsibility == PartyReseller {
			return invalid("tax_responsibility", "no_reseller", "tax_responsibility reseller needs an end_customer account")
		}
	}
	if err := checkCurrency("default_currency", a.DefaultCurrency); err != nil {
		return err
	}
	if err := validSettings(a.Invoice); err != nil {
		return err
	}
	return a.Tax.Validate()
}

// resellerOf checks the parent of an end customer: an active reseller account of another
// tenant, locked (FOR SHARE) so that it cannot be disabled under the change.
func resellerOf(ctx context.Context, tx pgx.Tx, parentID uuid.UUID, tenantID uuid.UUID) (uuid.UUID, error) {
	var typ, status string
	var rt uuid.UUID
	err := tx.QueryRow(ctx, `SELECT account_type, status, tenant_id FROM billing_accounts WHERE id = $1 FOR SHARE`, parentID).Scan(&typ, &status, &rt)
	if errors.Is(err, pgx.ErrNoRows) {
		return uuid.Nil, notFound("parent billing account", "parent_billing_account_id")
	}
	if err != nil {
		return uuid.Nil, fmt.Errorf("parent account: %w", err)
	}
	if typ != TypeReseller {
		return uuid.Nil, invalid("parent_billing_account_id", "parent_not_reseller", "the parent of an end customer must be a reseller account (it is %s)", typ)
	}
	if status != StatusActive {
		return uuid.Nil, conflict("reseller_not_active", "the reseller account is %s", status).With("field", "parent_billing_account_id").With("reseller_status", status)
	}
	if rt == tenantID {
		return uuid.Nil, invalid("parent_billing_account_id", "own_reseller", "a tenant cannot be its own reseller")
	}
	return rt, nil
}

func ratesJSON(r []TaxRate) []byte {
	if r == nil {
		r = []TaxRate{}
	}
	b, _ := json.Marshal(r)
	return b
}

func evidenceJSON(e map[string]any) []byte {
	if e == nil {
		e = map[string]any{}
	}
	b, _ := json.Marshal(e)
	return b
}

// Create creates the tenant's billing account (one per tenant), audited.
func (s *Service) Create(ctx context.Context, c Create) (Account, error) {
	switch c.Type {
	case TypeTenant, TypeReseller, TypeEndCustomer:
	default:
		return Account{}, invalid("account_type", "unknown_account_type", "unknown account type %q", c.Type)
	}
	if c.Type == TypeEndCustomer && c.ParentID == nil {
		return Account{}, invalid("parent_billing_account_id", "parent_required", "an end_customer account names its reseller's account")
	}
	if c.Type != TypeEndCustomer && c.ParentID != nil {
		return Account{}, invalid("parent_billing_account_id", "parent_not_allowed", "only an end_customer account has a parent")
	}
	now := s.Clock.Now()
	var out Account
	err := db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		cur, err := tenantCurrency(ctx, tx, c.TenantID, "tenant_id")
		if err != nil {
			return err
		}
		a := Account{ID: s.IDs.New(), TenantID: c.TenantID, Type: c.Type, Name: c.Name, ParentID: c.ParentID,
			InvoiceRecipientTenantID: c.InvoiceRecipientTenantID, DefaultCurrency: cur, WholesalePlanID: c.WholesalePlanID,
			CustomerPlanID: c.CustomerPlanID, TaxResponsibility: PartyPlatform, CreditRiskOwner: PartyPlatform, Status: StatusActive,
			Tax: TaxProfile{Treatment: invoices.TreatmentNotConfigured}, CreatedAt: now, UpdatedAt: now}
		if c.Type == TypeEndCustomer {
			a.TaxResponsibility, a.CreditRiskOwner = PartyReseller, PartyReseller
		}
		if c.DefaultCurrency != nil {
			a.DefaultCurrency = *c.DefaultCurrency
		}
		if c.TaxResponsibility != nil {
			a.TaxResponsibility = *c.TaxResponsibility
		}
		if c.CreditRiskOwner != nil {
			a.CreditRiskOwner = *c.CreditRiskOwner
		}
		if c.Tax != nil {
			a.Tax = *c.Tax
		}
		a.Invoice = InvoiceSettings{Currency: a.DefaultCurrency, Period: "monthly", PaymentTermsDays: invoices.DefaultTerms}
		if c.Invoice != nil {
			a.Invoice = *c.Invoice
		}
		if err := check(&a); err != nil {
			return err
		}
		if a.ParentID != nil {
			rt, err := resellerOf(ctx, tx, *a.ParentID, a.TenantID)
			if err != nil {
				return err
			}
			a.ResellerTenantID = &rt
		}
		if a.InvoiceRecipientTenantID != nil {
			if _, err := tenantCurrency(ctx, tx, *a.InvoiceRecipientTenantID, "invoice_recipient_tenant_id"); err != nil {
				return err
			}
		}
		if err := planExists(ctx, tx, a.WholesalePlanID, "wholesale_pricing_plan_id"); err != nil {
			return err
		}
		if err := planExists(ctx, tx, a.CustomerPlanID, "customer_pricing_plan_id"); err != nil {
			return err
		}
		tag, err := tx.Exec(ctx, `INSERT INTO billing_accounts (id, tenant_id, account_type, name, parent_billing_account_id,
			reseller_tenant_id, invoice_recipient_tenant_id, default_currency, wholesale_pricing_plan_id, customer_pricing_plan_id,
			tax_responsibility, credit_risk_owner, status, tax_treatment, tax_jurisdiction, seller_tax_registration,
			customer_tax_registration, tax_rates, default_tax_rate_bps, tax_exempt_reason, tax_evidence, invoice_currency,
			invoice_period, payment_terms_days, created_at, updated_at)
			VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13,$14,$15,$16,$17,$18,$19,$20,$21,$22,$23,$24,$25,$25)
			ON CONFLICT (tenant_id) DO NOTHING`,
			a.ID, a.TenantID, a.Type, a.Name, null(a.ParentID), null(a.ResellerTenantID), null(a.InvoiceRecipientTenantID),
			a.DefaultCurrency, null(a.WholesalePlanID), null(a.CustomerPlanID), a.TaxResponsibility, a.CreditRiskOwner, a.Status,
			a.Tax.Treatment, a.Tax.Jurisdiction, a.Tax.SellerRegistration, a.Tax.CustomerRegistration, ratesJSON(a.Tax.Rates),
			a.Tax.DefaultRateBps, a.Tax.ExemptReason, evidenceJSON(a.Tax.Evidence), a.Invoice.Currency, a.Invoice.Period,
			a.Invoice.PaymentTermsDays, now)
		if err != nil {
			return fmt.Errorf("insert account: %w", err)
		}
		if tag.RowsAffected() == 0 {
			return conflict("account_exists", "the tenant has a billing account").With("field", "tenant_id")
		}
		if err := s.Audit.Record(ctx, tx, audit.Entry{Action: "billing.account.create", TargetType: "billing_account",
			TargetID: a.ID.String(), TenantID: a.TenantID, Metadata: map[string]any{"account_type": a.Type}}); err != nil {
			return err
		}
		out, err = s.get(ctx, tx, "a.id = $1", a.ID, false)
		return err
	})
	return out, err
}

// Update is a change of an account; nil fields keep their value.
type Update struct {
	Name                     *string
	InvoiceRecipientTenantID *uuid.UUID
	WholesalePlanID          *uuid.UUID
	CustomerPlanID           *uuid.UUID
	TaxResponsibility        *string
	CreditRiskOwner          *string
	Status                   *string
	Tax                      *TaxProfile
	Invoice                  *InvoiceSettings
	ActorID                  uuid.UUID
}

// Update changes the account, audited. A deleted account is final; an end customer
// cannot be re-activated while its reseller is not active.
func (s *Service) Update(ctx context.Context, id uuid.UUID, u Update) (Account, error) {
	var out Account
	err := db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		a, err := s.get(ctx, tx, "a.id = $1", id, true)
		if errors.Is(err, pgx.ErrNoRows) {
			return notFound("billing account", "billing_account_id")
		}
		if err != nil {
			return err
		}
		if a.Status == StatusDeleted {
			return conflict("account_deleted", "the billing account is deleted").With("status", a.Status)
		}
		changed := []string{}
		if u.Name != nil {
			a.Name = *u.Name
			changed = append(changed, "name")
		}
		if u.InvoiceRecipientTenantID != nil {
			if _, err := tenantCurrency(ctx, tx, *u.InvoiceRecipientTenantID, "invoice_recipient_tenant_id"); err != nil {
				return err
			}
			a.InvoiceRecipientTenantID = u.InvoiceRecipientTenantID
			changed = append(changed, "invoice_recipient_tenant_id")
		}
		if u.WholesalePlanID != nil {
			if err := planExists(ctx, tx, u.WholesalePlanID, "wholesale_pricing_plan_id"); err != nil {
				return err
			}
			a.WholesalePlanID = u.WholesalePlanID
			changed = append(changed, "wholesale_pricing_plan_id")
		}
		if u.CustomerPlanID != nil {
			if err := planExists(ctx, tx, u.CustomerPlanID, "customer_pricing_plan_id"); err != nil {
				return err
			}
			a.CustomerPlanID = u.CustomerPlanID
			changed = append(changed, "customer_pricing_plan_id")
		}
		if u.TaxResponsibility != nil {
			a.TaxResponsibility = *u.TaxResponsibility
			changed = append(changed, "tax_responsibility")
		}
		if u.CreditRiskOwner != nil {
			a.CreditRiskOwner = *u.CreditRiskOwner
			changed = append(changed, "credit_risk_owner")
		}
		if u.Tax != nil {
			a.Tax = *u.Tax
			changed = append(changed, "tax_profile")
		}
		if u.Invoice != nil {
			a.Invoice = *u.Invoice
			changed = append(changed, "invoice_settings")
		}
		from := a.Status
		if u.Status != nil {
			switch *u.Status {
			case StatusActive, StatusDisabled, StatusDeleted:
			default:
				return invalid("status", "unknown_status", "unknown status %q", *u.Status)
			}
			a.Status = *u.Status
			changed = append(changed, "status")
		}
		if err := check(&a); err != nil {
			return err
		}
		if a.Type == TypeEndCustomer && a.Status == StatusActive && from != StatusActive {
			if _, err := resellerOf(ctx, tx, *a.ParentID, a.TenantID); err != nil {
				return err
			}
		}
		if a.Type == TypeReseller && a.Status == StatusDeleted {
			var n int
			if err := tx.QueryRow(ctx, `SELECT count(*) FROM billing_accounts WHERE parent_billing_account_id = $1 AND status <> 'deleted'`, a.ID).Scan(&n); err != nil {
				return err
			}
			if n > 0 {
				return conflict("reseller_has_customers", "the reseller still has %d end-customer accounts", n)
			}
		}
		now := s.Clock.Now()
		if _, err := tx.Exec(ctx, `UPDATE billing_accounts SET name = $2, invoice_recipient_tenant_id = $3,
			wholesale_pricing_plan_id = $4, customer_pricing_plan_id = $5, tax_responsibility = $6, credit_risk_owner = $7,
			status = $8, tax_treatment = $9, tax_jurisdiction = $10, seller_tax_registration = $11,
			customer_tax_registration = $12, tax_rates = $13, default_tax_rate_bps = $14, tax_exempt_reason = $15,
			tax_evidence = $16, invoice_currency = $17, invoice_period = $18, payment_terms_days = $19, updated_at = $20
			WHERE id = $1`,
			a.ID, a.Name, null(a.InvoiceRecipientTenantID), null(a.WholesalePlanID), null(a.CustomerPlanID),
			a.TaxResponsibility, a.CreditRiskOwner, a.Status, a.Tax.Treatment, a.Tax.Jurisdiction, a.Tax.SellerRegistration,
			a.Tax.CustomerRegistration, ratesJSON(a.Tax.Rates), a.Tax.DefaultRateBps, a.Tax.ExemptReason,
			evidenceJSON(a.Tax.Evidence), a.Invoice.Currency, a.Invoice.Period, a.Invoice.PaymentTermsDays, now); err != nil {
			return fmt.Errorf("update account: %w", err)
		}
		if err := s.Audit.Record(ctx, tx, audit.Entry{Action: "billing.account.update", TargetType: "billing_account",
			TargetID: a.ID.String(), TenantID: a.TenantID,
			Metadata: map[string]any{"changed": changed, "status_from": from, "status_to": a.Status}}); err != nil {
			return err
		}
		out, err = s.get(ctx, tx, "a.id = $1", a.ID, false)
		return err
	})
	return out, err
}

// AssignPlan sets the tenant's customer pricing plan (nil: the default plan), creating
// its tenant account when it has none. Audited.
func (s *Service) AssignPlan(ctx context.Context, tenantID uuid.UUID, planID *uuid.UUID, actor uuid.UUID) (Account, error) {
	var out Account
	err := db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		cur, err := tenantCurrency(ctx, tx, tenantID, "tenant_id")
		if err != nil {
			return err
		}
		if err := planExists(ctx, tx, planID, "pricing_plan_id"); err != nil {
			return err
		}
		now := s.Clock.Now()
		var id uuid.UUID
		var status string
		err = tx.QueryRow(ctx, `INSERT INTO billing_accounts (id, tenant_id, account_type, customer_pricing_plan_id, invoice_currency, created_at, updated_at)
			VALUES ($1, $2, 'tenant', $3, $4, $5, $5)
			ON CONFLICT (tenant_id) DO UPDATE SET customer_pricing_plan_id = EXCLUDED.customer_pricing_plan_id, updated_at = EXCLUDED.updated_at
			RETURNING id, status`, s.IDs.New(), tenantID, null(planID), cur, now).Scan(&id, &status)
		if err != nil {
			return fmt.Errorf("assign plan: %w", err)
		}
		if status == StatusDeleted {
			return conflict("account_deleted", "the tenant's billing account is deleted")
		}
		plan := ""
		if planID != nil {
			plan = planID.String()
		}
		if err := s.Audit.Record(ctx, tx, audit.Entry{Action: "billing.pricing_plan.assign", TargetType: "tenant",
			TargetID: tenantID.String(), TenantID: tenantID, Metadata: map[string]any{"pricing_plan_id": plan, "billing_account_id": id.String()}}); err != nil {
			return err
		}
		out, err = s.get(ctx, tx, "a.id = $1", id, false)
		return err
	})
	return out, err
}

// InvoiceAccount implements invoices.Accounts: who sells to the tenant and under which
// tax profile and terms. A tenant without an account is the platform's plain customer;
// a deleted account, an end customer whose reseller is not active, and an invoice
// currency other than the account's are refused.
func (s *Service) InvoiceAccount(ctx context.Context, tx pgx.Tx, tenantID uuid.UUID, currency string) (invoices.Account, error) {
	a, err := scanAccount(tx.QueryRow(ctx, selectAccount+" WHERE a.tenant_id = $1", tenantID))
	if errors.Is(err, pgx.ErrNoRows) {
		return invoices.TenantAccounts{SellerName: s.SellerName}.InvoiceAccount(ctx, tx, tenantID, currency)
	}
	if err != nil {
		return invoices.Account{}, fmt.Errorf("invoice account: %w", err)
	}
	if a.Status == StatusDeleted {
		return invoices.Account{}, conflict("account_deleted", "the billing account is deleted")
	}
	out := invoices.Account{ID: uuid.NullUUID{UUID: a.ID, Valid: true}, TenantID: tenantID, SellerKey: invoices.PlatformSeller,
		SellerName: s.SellerName, CustomerName: a.Name, PaymentTermsDays: a.Invoice.PaymentTermsDays, Tax: a.Tax.invoiceProfile()}
	if a.Type == TypeEndCustomer {
		var status, name string
		if err := tx.QueryRow(ctx, `SELECT a.status, COALESCE(a.name, t.name) FROM billing_accounts a JOIN tenants t ON t.id = a.tenant_id
			WHERE a.id = $1`, *a.ParentID).Scan(&status, &name); err != nil {
			return invoices.Account{}, fmt.Errorf("reseller account: %w", err)
		}
		if status != StatusActive {
			return invoices.Account{}, conflict("reseller_not_active", "the reseller account is %s", status).With("reseller_status", status)
		}
		// The customer-priced invoice of an end customer whose credit risk the reseller
		// carries is the reseller's to issue; with platform risk the platform issues it.
		if a.CreditRiskOwner == PartyReseller {
			out.SellerKey, out.SellerName = "reseller:"+a.ResellerTenantID.String(), name
		}
	}
	// Tax only where tax_responsibility says: the seller charges tax only when it is the
	// responsible party; otherwise a standard profile yields no tax lines (the other
	// treatments charge none anyway and keep their notes and evidence).
	seller := PartyPlatform
	if out.SellerKey != invoices.PlatformSeller {
		seller = PartyReseller
	}
	if a.TaxResponsibility != seller && out.Tax.Treatment == invoices.TreatmentStandard {
		out.Tax = invoices.TaxProfile{Treatment: invoices.TreatmentNotConfigured, Jurisdiction: a.Tax.Jurisdiction}
	}
	if currency != "" && a.Invoice.Currency != currency {
		return invoices.Account{}, invalid("currency", "currency_mismatch",
			"the account invoices in %s; %s usage is not mixed into its invoices", a.Invoice.Currency, currency)
	}
	return out, nil
}
