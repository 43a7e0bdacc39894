package readmodels

import (
	"context"

	"github.com/gantry-gpu/gantry/proto/api"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// Operations not implemented yet answer 503 service_unavailable (issue 21 work in progress);
// each moves out of this file when it is built.

func notWired() error { return apierr.New(apierr.ServiceUnavailable, "not wired yet") }

// GetV3ShellContext answers 503 until implemented.
func (*Handlers) GetV3ShellContext(context.Context, api.GetV3ShellContextRequestObject) (api.GetV3ShellContextResponseObject, error) {
	return nil, notWired()
}

// PutV3NotificationReadMarker answers 503 until implemented.
func (*Handlers) PutV3NotificationReadMarker(context.Context, api.PutV3NotificationReadMarkerRequestObject) (api.PutV3NotificationReadMarkerResponseObject, error) {
	return nil, notWired()
}

// ListV3Workloads answers 503 until implemented.
func (*Handlers) ListV3Workloads(context.Context, api.ListV3WorkloadsRequestObject) (api.ListV3WorkloadsResponseObject, error) {
	return nil, notWired()
}

// GetV3Workload answers 503 until implemented.
func (*Handlers) GetV3Workload(context.Context, api.GetV3WorkloadRequestObject) (api.GetV3WorkloadResponseObject, error) {
	return nil, notWired()
}

// DismissV3Attention answers 503 until implemented.
func (*Handlers) DismissV3Attention(context.Context, api.DismissV3AttentionRequestObject) (api.DismissV3AttentionResponseObject, error) {
	return nil, notWired()
}

// GetV3PlatformOps answers 503 until implemented.
func (*Handlers) GetV3PlatformOps(context.Context, api.GetV3PlatformOpsRequestObject) (api.GetV3PlatformOpsResponseObject, error) {
	return nil, notWired()
}

// GetV3PlatformSignal answers 503 until implemented.
func (*Handlers) GetV3PlatformSignal(context.Context, api.GetV3PlatformSignalRequestObject) (api.GetV3PlatformSignalResponseObject, error) {
	return nil, notWired()
}

// ListPlatformReleases answers 503 until implemented.
func (*Handlers) ListPlatformReleases(context.Context, api.ListPlatformReleasesRequestObject) (api.ListPlatformReleasesResponseObject, error) {
	return nil, notWired()
}

// GetAdminOpsOverview answers 503 until implemented.
func (*Handlers) GetAdminOpsOverview(context.Context, api.GetAdminOpsOverviewRequestObject) (api.GetAdminOpsOverviewResponseObject, error) {
	return nil, notWired()
}
