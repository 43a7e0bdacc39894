package payments

import (
	"context"
	"time"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/pagination"
	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/proto/api"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// Handlers implements the Payments and AdminPayments operations.
type Handlers struct {
	Svc     *Service
	Cursors pagination.Codec
}

// NewHandlers returns the handlers over svc.
func NewHandlers(svc *Service, cursors pagination.Codec) *Handlers {
	return &Handlers{Svc: svc, Cursors: cursors}
}

// Cursor sort names: a cursor of one list is refused by the other.
const (
	sortTenant = "payments.id.desc"
	sortAdmin  = "admin.payments.id.desc"
)

// tenantAdmin is the caller when it administers its tenant; payments move the tenant's
// money, so members may not.
func tenantAdmin(ctx context.Context) (*principal.Principal, error) {
	p, ok := principal.From(ctx)
	if !ok {
		return nil, apierr.New(apierr.TokenMissing, "authentication required")
	}
	if p.TenantID == uuid.Nil || !p.IsTenantAdmin(p.TenantID) {
		return nil, apierr.Forbidden("payments are managed by a tenant admin")
	}
	return p, nil
}

func utc(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}

func apiPayment(p Payment) api.Payment {
	return api.Payment{
		ID: p.ID, TenantID: p.TenantID, Provider: api.PaymentProvider(p.Provider), ProviderPaymentID: p.ProviderPaymentID,
		Status:      api.PaymentStatus(p.Status),
		Amount:      api.Money{AmountMinor: p.AmountMinor, Currency: p.Currency},
		Captured:    api.Money{AmountMinor: p.CapturedMinor, Currency: p.Currency},
		Refunded:    api.Money{AmountMinor: p.RefundedMinor, Currency: p.Currency},
		FailureCode: p.FailureCode, CapturedAt: utc(p.CapturedAt),
		CreatedAt: p.CreatedAt.UTC(), UpdatedAt: p.UpdatedAt.UTC(),
	}
}

func apiRefund(r Refund) api.PaymentRefund {
	return api.PaymentRefund{
		ID: r.ID, PaymentID: r.PaymentID, Amount: api.Money{AmountMinor: r.AmountMinor, Currency: r.Currency},
		Origin: api.PaymentRefundOrigin(r.Origin), Reason: r.Reason, CreatedAt: r.CreatedAt.UTC(),
	}
}

func (h *Handlers) listResponse(pg Page, size int, sort string) (api.PaymentListResponse, error) {
	out := api.PaymentListResponse{Items: make([]api.Payment, 0, len(pg.Items)), Pagination: api.Pagination{PageSize: size}}
	for _, p := range pg.Items {
		out.Items = append(out.Items, apiPayment(p))
	}
	if pg.More {
		var err error
		if out.Pagination.NextCursor, err = h.Cursors.Next(true, sort, pg.Items[len(pg.Items)-1].ID); err != nil {
			return out, err
		}
	}
	return out, nil
}

func (h *Handlers) after(cursor *string, sort string) (uuid.UUID, error) {
	var after uuid.UUID
	err := h.Cursors.DecodeAfter(cursor, sort, &after)
	return after, err
}

// CreatePaymentTopUp implements POST /api/v1/payments/top-ups.
func (h *Handlers) CreatePaymentTopUp(ctx context.Context, req api.CreatePaymentTopUpRequestObject) (api.CreatePaymentTopUpResponseObject, error) {
	p, err := tenantAdmin(ctx)
	if err != nil {
		return nil, err
	}
	tu, err := h.Svc.CreateTopUp(ctx, p.TenantID, p.UserID, req.Body.Amount.Currency, req.Body.Amount.AmountMinor)
	if err != nil {
		return nil, err
	}
	out := api.PaymentTopUpResponse{Payment: apiPayment(tu.Payment)}
	if tu.ClientSecret != "" {
		out.ClientSecret = &tu.ClientSecret
	}
	return api.CreatePaymentTopUp201JSONResponse{Body: out}, nil
}

// ListPayments implements GET /api/v1/payments.
func (h *Handlers) ListPayments(ctx context.Context, req api.ListPaymentsRequestObject) (api.ListPaymentsResponseObject, error) {
	p, err := tenantAdmin(ctx)
	if err != nil {
		return nil, err
	}
	after, err := h.after(req.Params.Cursor, sortTenant)
	if err != nil {
		return nil, err
	}
	size := pagination.Size(req.Params.PageSize)
	pg, err := h.Svc.ListTenant(ctx, p.TenantID, after, size)
	if err != nil {
		return nil, err
	}
	out, err := h.listResponse(pg, size, sortTenant)
	if err != nil {
		return nil, err
	}
	return api.ListPayments200JSONResponse{Body: out}, nil
}

// ReceivePaymentWebhook implements POST /api/v1/payments/webhooks/{provider}.
func (h *Handlers) ReceivePaymentWebhook(ctx context.Context, req api.ReceivePaymentWebhookRequestObject) (api.ReceivePaymentWebhookResponseObject, error) {
	sig := ""
	if req.Params.StripeSignature != nil {
		sig = *req.Params.StripeSignature
	}
	ack, err := h.Svc.ReceiveWebhook(ctx, string(req.Provider), sig, req.Body)
	if err != nil {
		return nil, err
	}
	return api.ReceivePaymentWebhook200JSONResponse{Body: api.PaymentWebhookAck{
		Received: true, Duplicate: ack.Duplicate, EventID: ack.EventID,
	}}, nil
}

// ListAdminPayments implements GET /api/v1/admin/payments.
func (h *Handlers) ListAdminPayments(ctx context.Context, req api.ListAdminPaymentsRequestObject) (api.ListAdminPaymentsResponseObject, error) {
	if _, err := principal.PlatformAdmin(ctx); err != nil {
		return nil, err
	}
	after, err := h.after(req.Params.Cursor, sortAdmin)
	if err != nil {
		return nil, err
	}
	var tenant uuid.UUID
	if req.Params.TenantID != nil {
		tenant = *req.Params.TenantID
	}
	var status *string
	if req.Params.Status != nil {
		status = ptr(string(*req.Params.Status))
	}
	size := pagination.Size(req.Params.PageSize)
	pg, err := h.Svc.ListAll(ctx, tenant, status, after, size)
	if err != nil {
		return nil, err
	}
	out, err := h.listResponse(pg, size, sortAdmin)
	if err != nil {
		return nil, err
	}
	return api.ListAdminPayments200JSONResponse{Body: out}, nil
}

// CreatePaymentRefund implements POST /api/v1/admin/payments/{payment_id}/refunds.
func (h *Handlers) CreatePaymentRefund(ctx context.Context, req api.CreatePaymentRefundRequestObject) (api.CreatePaymentRefundResponseObject, error) {
	p, err := principal.PlatformAdmin(ctx)
	if err != nil {
		return nil, err
	}
	ref, pay, err := h.Svc.Refund(ctx, RefundRequestInput{
		PaymentID: req.PaymentID, Currency: req.Body.Amount.Currency, AmountMinor: req.Body.Amount.AmountMinor,
		Reason: req.Body.Reason, RequestedBy: p.UserID,
	})
	if err != nil {
		return nil, err
	}
	return api.CreatePaymentRefund201JSONResponse{Body: api.PaymentRefundResponse{Refund: apiRefund(ref), Payment: apiPayment(pay)}}, nil
}
