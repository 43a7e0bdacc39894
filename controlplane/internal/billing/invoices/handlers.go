package invoices

import (
	"bytes"
	"context"
	"mime"
	"net/http"
	"strconv"
	"strings"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/pagination"
	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/proto/api"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// Handlers is the invoices slice of the generated strict-server interface:
// ListBillingInvoices, GetBillingInvoice, ListAdminBillingInvoices, IssueBillingInvoice,
// VoidBillingInvoice and WriteOffBillingInvoice. GetBillingInvoice needs StrictMiddleware
// in the server's strict middlewares to see the Accept header.
type Handlers struct {
	Svc     *Service
	Cursors pagination.Codec
}

// NewHandlers returns the handlers over svc.
func NewHandlers(svc *Service, cursors pagination.Codec) *Handlers {
	return &Handlers{Svc: svc, Cursors: cursors}
}

type acceptKey struct{}

// StrictMiddleware hands GetBillingInvoice the request's Accept header (the strict
// request object does not carry it): application/pdf asks for the PDF.
func (h *Handlers) StrictMiddleware(f api.StrictHandlerFunc, op string) api.StrictHandlerFunc {
	if op != "GetBillingInvoice" {
		return f
	}
	return func(ctx context.Context, w http.ResponseWriter, r *http.Request, request any) (any, error) {
		return f(context.WithValue(ctx, acceptKey{}, r.Header.Values("Accept")), w, r, request)
	}
}

// WithAccept returns ctx carrying an Accept header (what StrictMiddleware does; for
// callers that invoke the handler directly).
func WithAccept(ctx context.Context, accept ...string) context.Context {
	return context.WithValue(ctx, acceptKey{}, accept)
}

// wantsPDF: application/pdf is accepted and preferred over JSON (a plain browser Accept
// of */* gets JSON, the contract's default).
func wantsPDF(ctx context.Context) bool {
	values, _ := ctx.Value(acceptKey{}).([]string)
	pdfQ, jsonQ := -1.0, -1.0
	for _, v := range values {
		for _, part := range strings.Split(v, ",") {
			mt, params, err := mime.ParseMediaType(strings.TrimSpace(part))
			if err != nil {
				continue
			}
			q := 1.0
			if v, ok := params["q"]; ok {
				if f, err := strconv.ParseFloat(v, 64); err == nil && f >= 0 && f <= 1 {
					q = f
				}
			}
			switch mt {
			case "application/pdf":
				pdfQ = max(pdfQ, q)
			case "application/json":
				jsonQ = max(jsonQ, q)
			}
		}
	}
	return pdfQ > 0 && pdfQ >= jsonQ
}

// tenantOf is the caller's tenant; invoices are read within one.
func tenantOf(ctx context.Context) (uuid.UUID, error) {
	p, err := principal.Required(ctx)
	if err != nil {
		return uuid.Nil, err
	}
	if p.TenantID == uuid.Nil {
		return uuid.Nil, apierr.Forbidden("invoices belong to an organization; this account belongs to none").With("reason", "no_tenant")
	}
	return p.TenantID, nil
}

const listSort = "period_start_desc"

func (h *Handlers) list(ctx context.Context, f Filter, cursor *string, size *int) (api.BillingInvoiceListResponse, error) {
	f.Limit = pagination.Size(size)
	var pos Position
	if cursor != nil {
		if err := h.Cursors.Decode(*cursor, listSort, &pos); err != nil {
			return api.BillingInvoiceListResponse{}, err
		}
		f.After = &pos
	}
	if f.Status != nil && !validStatus(*f.Status) {
		return api.BillingInvoiceListResponse{}, apierr.Validation("status", "unknown status %q", *f.Status).With("reason", "invalid_enum")
	}
	if f.From != nil && f.To != nil && !f.To.After(*f.From) {
		return api.BillingInvoiceListResponse{}, apierr.Validation("to", "to must be after from").With("reason", "empty_window")
	}
	items, more, err := h.Svc.List(ctx, f)
	if err != nil {
		return api.BillingInvoiceListResponse{}, err
	}
	out := api.BillingInvoiceListResponse{Items: make([]api.BillingInvoiceSummary, 0, len(items)), Pagination: api.Pagination{PageSize: f.Limit}}
	for _, inv := range items {
		out.Items = append(out.Items, apiSummary(inv))
	}
	if more && len(items) > 0 {
		last := items[len(items)-1]
		next, err := h.Cursors.Next(true, listSort, Position{PeriodStart: last.PeriodStart, ID: last.ID})
		if err != nil {
			return api.BillingInvoiceListResponse{}, err
		}
		out.Pagination.NextCursor = next
	}
	return out, nil
}

func validStatus(s string) bool {
	for _, v := range Statuses {
		if v == s {
			return true
		}
	}
	return false
}

func statusPtr(s *api.BillingInvoiceStatusFilter) *string {
	if s == nil {
		return nil
	}
	v := string(*s)
	return &v
}

// ListBillingInvoices implements GET /api/v1/billing/invoices: the caller's tenant's
// invoices, drafts never shown.
func (h *Handlers) ListBillingInvoices(ctx context.Context, req api.ListBillingInvoicesRequestObject) (api.ListBillingInvoicesResponseObject, error) {
	tenant, err := tenantOf(ctx)
	if err != nil {
		return nil, err
	}
	p := req.Params
	if p.Status != nil && *p.Status == StatusDraft {
		return api.ListBillingInvoices200JSONResponse{Body: api.BillingInvoiceListResponse{Items: []api.BillingInvoiceSummary{},
			Pagination: api.Pagination{PageSize: pagination.Size(p.PageSize)}}}, nil
	}
	out, err := h.list(ctx, Filter{TenantID: tenant, HideDrafts: true, Status: statusPtr(p.Status), From: p.From, To: p.To}, p.Cursor, p.PageSize)
	if err != nil {
		return nil, err
	}
	return api.ListBillingInvoices200JSONResponse{Body: out}, nil
}

// GetBillingInvoice implements GET /api/v1/billing/invoices/{invoice_id}: JSON, or the
// PDF when the client accepts application/pdf. Another tenant's invoice and drafts: 404.
func (h *Handlers) GetBillingInvoice(ctx context.Context, req api.GetBillingInvoiceRequestObject) (api.GetBillingInvoiceResponseObject, error) {
	tenant, err := tenantOf(ctx)
	if err != nil {
		return nil, err
	}
	inv, err := h.Svc.Get(ctx, tenant, req.InvoiceID)
	if err != nil {
		return nil, err
	}
	if wantsPDF(ctx) {
		doc, err := RenderPDF(inv)
		if err != nil {
			return nil, err
		}
		return api.GetBillingInvoice200ApplicationPdfResponse{Body: bytes.NewReader(doc), ContentLength: int64(len(doc))}, nil
	}
	return api.GetBillingInvoice200JSONResponse{Body: APIDetail(inv)}, nil
}

// ListAdminBillingInvoices implements GET /api/v1/admin/billing/invoices.
func (h *Handlers) ListAdminBillingInvoices(ctx context.Context, req api.ListAdminBillingInvoicesRequestObject) (api.ListAdminBillingInvoicesResponseObject, error) {
	if _, err := principal.PlatformAdmin(ctx); err != nil {
		return nil, err
	}
	p := req.Params
	f := Filter{Status: statusPtr(p.Status), From: p.From, To: p.To}
	if p.OrgID != nil {
		f.TenantID = *p.OrgID
	}
	out, err := h.list(ctx, f, p.Cursor, p.PageSize)
	if err != nil {
		return nil, err
	}
	return api.ListAdminBillingInvoices200JSONResponse{Body: out}, nil
}

// IssueBillingInvoice implements POST /api/v1/admin/billing/invoices/{invoice_id}/issue.
func (h *Handlers) IssueBillingInvoice(ctx context.Context, req api.IssueBillingInvoiceRequestObject) (api.IssueBillingInvoiceResponseObject, error) {
	if _, err := principal.PlatformAdmin(ctx); err != nil {
		return nil, err
	}
	if _, err := h.Svc.Issue(ctx, req.InvoiceID); err != nil {
		return nil, err
	}
	inv, err := h.Svc.Get(ctx, uuid.Nil, req.InvoiceID)
	if err != nil {
		return nil, err
	}
	return api.IssueBillingInvoice200JSONResponse{Body: APIDetail(inv)}, nil
}

// VoidBillingInvoice implements POST /api/v1/admin/billing/invoices/{invoice_id}/void.
func (h *Handlers) VoidBillingInvoice(ctx context.Context, req api.VoidBillingInvoiceRequestObject) (api.VoidBillingInvoiceResponseObject, error) {
	if _, err := principal.PlatformAdmin(ctx); err != nil {
		return nil, err
	}
	if req.Body == nil {
		return nil, apierr.Validation("reason", "a reason is required").With("reason", "required")
	}
	recredit := req.Body.Recredit != nil && *req.Body.Recredit
	if _, err := h.Svc.Void(ctx, req.InvoiceID, req.Body.Reason, recredit); err != nil {
		return nil, err
	}
	inv, err := h.Svc.Get(ctx, uuid.Nil, req.InvoiceID)
	if err != nil {
		return nil, err
	}
	return api.VoidBillingInvoice200JSONResponse{Body: APIDetail(inv)}, nil
}

// WriteOffBillingInvoice implements POST /api/v1/admin/billing/invoices/{invoice_id}/write-off.
func (h *Handlers) WriteOffBillingInvoice(ctx context.Context, req api.WriteOffBillingInvoiceRequestObject) (api.WriteOffBillingInvoiceResponseObject, error) {
	if _, err := principal.PlatformAdmin(ctx); err != nil {
		return nil, err
	}
	if req.Body == nil {
		return nil, apierr.Validation("reason", "a reason is required").With("reason", "required")
	}
	if _, err := h.Svc.WriteOff(ctx, req.InvoiceID, req.Body.Reason); err != nil {
		return nil, err
	}
	inv, err := h.Svc.Get(ctx, uuid.Nil, req.InvoiceID)
	if err != nil {
		return nil, err
	}
	return api.WriteOffBillingInvoice200JSONResponse{Body: APIDetail(inv)}, nil
}

func money(minor int64, currency string) api.Money {
	return api.Money{AmountMinor: minor, Currency: currency}
}

func nullable(id uuid.NullUUID) *uuid.UUID {
	if !id.Valid {
		return nil
	}
	v := id.UUID
	return &v
}

func apiSummary(inv Invoice) api.BillingInvoiceSummary {
	snap := inv.TaxSnapshot
	if snap == nil {
		snap = map[string]any{}
	}
	return api.BillingInvoiceSummary{
		ID: inv.ID, OrgID: inv.TenantID, PeriodStart: inv.PeriodStart, PeriodEnd: inv.PeriodEnd,
		Status: api.BillingInvoiceStatus(inv.Status), InvoiceNumber: inv.Number,
		Total: money(inv.Totals.Total, inv.Currency), TaxTotal: money(inv.Totals.Tax, inv.Currency),
		TaxJurisdiction: inv.TaxJurisdiction, TaxTreatment: api.BillingTaxTreatment(inv.TaxTreatment),
		SellerTaxRegistration: inv.SellerTaxRegistration, CustomerTaxRegistration: inv.CustomerTaxRegistration,
		TaxSnapshot: snap, IssuedAt: inv.IssuedAt, DueAt: inv.DueAt, FinalizedAt: inv.FinalizedAt, VoidedAt: inv.VoidedAt,
		CreatedAt: inv.CreatedAt,
	}
}

// APIDetail is inv (with its lines) as the contract's BillingInvoiceDetail.
func APIDetail(inv Invoice) api.BillingInvoiceDetail {
	s := apiSummary(inv)
	d := api.BillingInvoiceDetail{
		ID: s.ID, OrgID: s.OrgID, PeriodStart: s.PeriodStart, PeriodEnd: s.PeriodEnd, Status: s.Status,
		InvoiceNumber: s.InvoiceNumber, Total: s.Total, TaxTotal: s.TaxTotal, TaxJurisdiction: s.TaxJurisdiction,
		TaxTreatment: s.TaxTreatment, SellerTaxRegistration: s.SellerTaxRegistration,
		CustomerTaxRegistration: s.CustomerTaxRegistration, TaxSnapshot: s.TaxSnapshot, IssuedAt: s.IssuedAt,
		DueAt: s.DueAt, FinalizedAt: s.FinalizedAt, VoidedAt: s.VoidedAt, CreatedAt: s.CreatedAt,
		Lines: make([]api.BillingInvoiceLine, 0, len(inv.Lines)),
	}
	for _, l := range inv.Lines {
		ev := l.TaxEvidence
		if ev == nil {
			ev = map[string]any{}
		}
		d.Lines = append(d.Lines, api.BillingInvoiceLine{
			ID: l.ID, LineType: api.BillingInvoiceLineType(l.Type), Description: l.Description,
			Amount: money(l.Amount, l.Currency), RatedUsageLineID: nullable(l.RatedUsageLineID),
			LedgerEntryID: nullable(l.LedgerEntryID), PaymentSessionID: nullable(l.PaymentSessionID),
			TaxCategory: l.TaxCategory, TaxRateBps: l.TaxRateBps, TaxJurisdiction: l.TaxJurisdiction,
			TaxSubjectLineID: nullable(l.TaxSubjectLineID), TaxExemptReason: l.TaxExemptReason,
			ReverseChargeReason: l.ReverseChargeReason, TaxEvidence: ev, CreatedAt: l.CreatedAt,
		})
	}
	return d
}
