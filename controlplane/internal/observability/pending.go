// Package observability serves the platform observability read models (seed 4.2) and the
// runbook index. This file is a placeholder so that the contract's operations compile:
// each answers 503 service_unavailable until the package implements it (issue 21), and
// is deleted then.
package observability

import (
	"context"

	"github.com/gantry-gpu/gantry/proto/api"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// Handlers implements the observability and runbook operations of the contract.
type Handlers struct{}

func notWired() error { return apierr.New(apierr.ServiceUnavailable, "not wired yet") }

// ListObservabilityAlerts answers 503 until implemented.
func (*Handlers) ListObservabilityAlerts(context.Context, api.ListObservabilityAlertsRequestObject) (api.ListObservabilityAlertsResponseObject, error) {
	return nil, notWired()
}

// GetObservabilitySloEvidence answers 503 until implemented.
func (*Handlers) GetObservabilitySloEvidence(context.Context, api.GetObservabilitySloEvidenceRequestObject) (api.GetObservabilitySloEvidenceResponseObject, error) {
	return nil, notWired()
}

// GetObservabilityHealthSnapshot answers 503 until implemented.
func (*Handlers) GetObservabilityHealthSnapshot(context.Context, api.GetObservabilityHealthSnapshotRequestObject) (api.GetObservabilityHealthSnapshotResponseObject, error) {
	return nil, notWired()
}

// CreateObservabilityDrill answers 503 until implemented.
func (*Handlers) CreateObservabilityDrill(context.Context, api.CreateObservabilityDrillRequestObject) (api.CreateObservabilityDrillResponseObject, error) {
	return nil, notWired()
}

// ListAdminRunbooks answers 503 until implemented.
func (*Handlers) ListAdminRunbooks(context.Context, api.ListAdminRunbooksRequestObject) (api.ListAdminRunbooksResponseObject, error) {
	return nil, notWired()
}

// GetAdminRunbook answers 503 until implemented.
func (*Handlers) GetAdminRunbook(context.Context, api.GetAdminRunbookRequestObject) (api.GetAdminRunbookResponseObject, error) {
	return nil, notWired()
}
