package maas

import (
	"context"
	"net/http"

	"github.com/gantry-gpu/gantry/proto/api"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// Handlers implements the AdminMaasSites and AdminMaasLifecycle operations.
type Handlers struct{}

func notImplemented() error {
	return apierr.New(apierr.ServiceUnavailable, "the MAAS lifecycle is not implemented yet").WithStatus(http.StatusNotImplemented)
}

// AbortMaasOnboarding is not implemented yet (501).
func (h *Handlers) AbortMaasOnboarding(ctx context.Context, req api.AbortMaasOnboardingRequestObject) (api.AbortMaasOnboardingResponseObject, error) {
	return nil, notImplemented()
}

// CreateMaasOnboarding is not implemented yet (501).
func (h *Handlers) CreateMaasOnboarding(ctx context.Context, req api.CreateMaasOnboardingRequestObject) (api.CreateMaasOnboardingResponseObject, error) {
	return nil, notImplemented()
}

// CreateMaasProfile is not implemented yet (501).
func (h *Handlers) CreateMaasProfile(ctx context.Context, req api.CreateMaasProfileRequestObject) (api.CreateMaasProfileResponseObject, error) {
	return nil, notImplemented()
}

// CreateMaasSite is not implemented yet (501).
func (h *Handlers) CreateMaasSite(ctx context.Context, req api.CreateMaasSiteRequestObject) (api.CreateMaasSiteResponseObject, error) {
	return nil, notImplemented()
}

// CreateNodeDecommission is not implemented yet (501).
func (h *Handlers) CreateNodeDecommission(ctx context.Context, req api.CreateNodeDecommissionRequestObject) (api.CreateNodeDecommissionResponseObject, error) {
	return nil, notImplemented()
}

// DeleteMaasProfile is not implemented yet (501).
func (h *Handlers) DeleteMaasProfile(ctx context.Context, req api.DeleteMaasProfileRequestObject) (api.DeleteMaasProfileResponseObject, error) {
	return nil, notImplemented()
}

// DeleteMaasSite is not implemented yet (501).
func (h *Handlers) DeleteMaasSite(ctx context.Context, req api.DeleteMaasSiteRequestObject) (api.DeleteMaasSiteResponseObject, error) {
	return nil, notImplemented()
}

// GetMaasDecommission is not implemented yet (501).
func (h *Handlers) GetMaasDecommission(ctx context.Context, req api.GetMaasDecommissionRequestObject) (api.GetMaasDecommissionResponseObject, error) {
	return nil, notImplemented()
}

// GetMaasOnboarding is not implemented yet (501).
func (h *Handlers) GetMaasOnboarding(ctx context.Context, req api.GetMaasOnboardingRequestObject) (api.GetMaasOnboardingResponseObject, error) {
	return nil, notImplemented()
}

// GetMaasProfile is not implemented yet (501).
func (h *Handlers) GetMaasProfile(ctx context.Context, req api.GetMaasProfileRequestObject) (api.GetMaasProfileResponseObject, error) {
	return nil, notImplemented()
}

// GetMaasSite is not implemented yet (501).
func (h *Handlers) GetMaasSite(ctx context.Context, req api.GetMaasSiteRequestObject) (api.GetMaasSiteResponseObject, error) {
	return nil, notImplemented()
}

// ListMaasMachines is not implemented yet (501).
func (h *Handlers) ListMaasMachines(ctx context.Context, req api.ListMaasMachinesRequestObject) (api.ListMaasMachinesResponseObject, error) {
	return nil, notImplemented()
}

// ListMaasProfiles is not implemented yet (501).
func (h *Handlers) ListMaasProfiles(ctx context.Context, req api.ListMaasProfilesRequestObject) (api.ListMaasProfilesResponseObject, error) {
	return nil, notImplemented()
}

// ListMaasSites is not implemented yet (501).
func (h *Handlers) ListMaasSites(ctx context.Context, req api.ListMaasSitesRequestObject) (api.ListMaasSitesResponseObject, error) {
	return nil, notImplemented()
}

// RetryMaasOnboarding is not implemented yet (501).
func (h *Handlers) RetryMaasOnboarding(ctx context.Context, req api.RetryMaasOnboardingRequestObject) (api.RetryMaasOnboardingResponseObject, error) {
	return nil, notImplemented()
}

// RotateMaasSiteCredential is not implemented yet (501).
func (h *Handlers) RotateMaasSiteCredential(ctx context.Context, req api.RotateMaasSiteCredentialRequestObject) (api.RotateMaasSiteCredentialResponseObject, error) {
	return nil, notImplemented()
}

// SyncMaasSite is not implemented yet (501).
func (h *Handlers) SyncMaasSite(ctx context.Context, req api.SyncMaasSiteRequestObject) (api.SyncMaasSiteResponseObject, error) {
	return nil, notImplemented()
}

// UpdateMaasProfile is not implemented yet (501).
func (h *Handlers) UpdateMaasProfile(ctx context.Context, req api.UpdateMaasProfileRequestObject) (api.UpdateMaasProfileResponseObject, error) {
	return nil, notImplemented()
}

// UpdateMaasSite is not implemented yet (501).
func (h *Handlers) UpdateMaasSite(ctx context.Context, req api.UpdateMaasSiteRequestObject) (api.UpdateMaasSiteResponseObject, error) {
	return nil, notImplemented()
}

// PackageStub answers the node agent package operations until the package handler
// (controlplane/internal/maas/packages) is wired.
type PackageStub struct{}

// GetNodeAgentPackage is not implemented yet (501).
func (PackageStub) GetNodeAgentPackage(ctx context.Context, req api.GetNodeAgentPackageRequestObject) (api.GetNodeAgentPackageResponseObject, error) {
	return nil, notImplemented()
}

// GetNodeAgentPackageChecksum is not implemented yet (501).
func (PackageStub) GetNodeAgentPackageChecksum(ctx context.Context, req api.GetNodeAgentPackageChecksumRequestObject) (api.GetNodeAgentPackageChecksumResponseObject, error) {
	return nil, notImplemented()
}
