package observability

import (
	"context"

	"github.com/gantry-gpu/gantry/proto/api"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

func notWired() error { return apierr.New(apierr.ServiceUnavailable, "not wired yet") }

// CreateObservabilityDrill answers 503 until implemented.
func (*Handlers) CreateObservabilityDrill(context.Context, api.CreateObservabilityDrillRequestObject) (api.CreateObservabilityDrillResponseObject, error) {
	return nil, notWired()
}
