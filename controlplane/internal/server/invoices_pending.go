package server

import (
	"context"

	"github.com/gantry-gpu/gantry/proto/api"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// PendingInvoicesAPI answers the invoice operations (issue 24) with 501 until the
// invoices package's handlers are wired in its place.
type PendingInvoicesAPI struct{}

func notImplemented() error {
	return apierr.New(apierr.ServiceUnavailable, "not implemented yet").WithStatus(501)
}

// ListBillingInvoices implements GET /api/v1/billing/invoices.
func (PendingInvoicesAPI) ListBillingInvoices(context.Context, api.ListBillingInvoicesRequestObject) (api.ListBillingInvoicesResponseObject, error) {
	return nil, notImplemented()
}

// GetBillingInvoice implements GET /api/v1/billing/invoices/{invoice_id}.
func (PendingInvoicesAPI) GetBillingInvoice(context.Context, api.GetBillingInvoiceRequestObject) (api.GetBillingInvoiceResponseObject, error) {
	return nil, notImplemented()
}

// ListAdminBillingInvoices implements GET /api/v1/admin/billing/invoices.
func (PendingInvoicesAPI) ListAdminBillingInvoices(context.Context, api.ListAdminBillingInvoicesRequestObject) (api.ListAdminBillingInvoicesResponseObject, error) {
	return nil, notImplemented()
}

// IssueBillingInvoice implements POST /api/v1/admin/billing/invoices/{invoice_id}/issue.
func (PendingInvoicesAPI) IssueBillingInvoice(context.Context, api.IssueBillingInvoiceRequestObject) (api.IssueBillingInvoiceResponseObject, error) {
	return nil, notImplemented()
}

// VoidBillingInvoice implements POST /api/v1/admin/billing/invoices/{invoice_id}/void.
func (PendingInvoicesAPI) VoidBillingInvoice(context.Context, api.VoidBillingInvoiceRequestObject) (api.VoidBillingInvoiceResponseObject, error) {
	return nil, notImplemented()
}

// WriteOffBillingInvoice implements POST /api/v1/admin/billing/invoices/{invoice_id}/write-off.
func (PendingInvoicesAPI) WriteOffBillingInvoice(context.Context, api.WriteOffBillingInvoiceRequestObject) (api.WriteOffBillingInvoiceResponseObject, error) {
	return nil, notImplemented()
}
