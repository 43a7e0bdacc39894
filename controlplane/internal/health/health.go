// Package health answers liveness, readiness, the contract document, the metrics
// exposition and the operators' stats. Readiness checks PostgreSQL and NATS only: a
// replica that cannot reach either must leave the load balancer.
package health

import (
	"bytes"
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"

	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/proto/api"
	"github.com/gantry-gpu/gantry/proto/openapi"
	"github.com/gantry-gpu/gantry/shared/apierr"
	"github.com/gantry-gpu/gantry/shared/clock"
)

// Handlers implements the Health operations of the generated server.
type Handlers struct {
	Pool     *pgxpool.Pool
	NATS     *nats.Conn
	Gatherer prometheus.Gatherer
	Clock    clock.Clock
}

func (h *Handlers) GetHealth(context.Context, api.GetHealthRequestObject) (api.GetHealthResponseObject, error) {
	return api.GetHealth200JSONResponse{Body: api.HealthResponse{Ok: true}}, nil
}

func (h *Handlers) GetReadiness(ctx context.Context, _ api.GetReadinessRequestObject) (api.GetReadinessResponseObject, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	checks := api.ReadinessChecks{Postgres: api.ReadinessCheckStatusOk, Nats: api.ReadinessCheckStatusOk}
	if err := h.Pool.Ping(ctx); err != nil {
		checks.Postgres = api.ReadinessCheckStatusDown
	}
	if h.NATS == nil || !h.NATS.IsConnected() {
		checks.Nats = api.ReadinessCheckStatusDown
	} else if err := h.NATS.FlushWithContext(ctx); err != nil {
		checks.Nats = api.ReadinessCheckStatusDown
	}
	body := api.ReadinessResponse{Checks: checks, Ok: checks.Postgres == api.ReadinessCheckStatusOk && checks.Nats == api.ReadinessCheckStatusOk}
	if !body.Ok {
		return api.GetReadiness503JSONResponse{Body: body}, nil
	}
	return api.GetReadiness200JSONResponse{Body: body}, nil
}

func (h *Handlers) GetOpenAPIDocument(context.Context, api.GetOpenAPIDocumentRequestObject) (api.GetOpenAPIDocumentResponseObject, error) {
	return api.GetOpenAPIDocument200ApplicationYamlResponse{Body: bytes.NewReader(openapi.Document), ContentLength: int64(len(openapi.Document))}, nil
}

func (h *Handlers) GetMetrics(context.Context, api.GetMetricsRequestObject) (api.GetMetricsResponseObject, error) {
	families, err := h.Gatherer.Gather()
	if err != nil {
		return nil, apierr.Internal(err)
	}
	var buf bytes.Buffer
	enc := expfmt.NewEncoder(&buf, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, f := range families {
		if err := enc.Encode(f); err != nil {
			return nil, apierr.Internal(err)
		}
	}
	return api.GetMetrics200TextResponse{Body: buf.String()}, nil
}

func (h *Handlers) GetInternalStats(ctx context.Context, _ api.GetInternalStatsRequestObject) (api.GetInternalStatsResponseObject, error) {
	p, ok := principal.From(ctx)
	if !ok || !p.Can(principal.CapOpsRead) {
		return nil, apierr.New(apierr.InsufficientPermissions, "the platform.ops.read capability is required")
	}
	var s api.InternalStatsResponse
	err := h.Pool.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM tenants),
		(SELECT count(*) FROM users),
		(SELECT count(*) FROM projects WHERE deleted_at IS NULL),
		(SELECT count(*) FROM outbox_events WHERE published_at IS NULL)`).Scan(&s.Tenants, &s.Users, &s.Projects, &s.OutboxPending)
	if err != nil {
		return nil, apierr.Internal(err)
	}
	s.GeneratedAt = h.Clock.Now().UTC()
	return api.GetInternalStats200JSONResponse{Body: s}, nil
}
