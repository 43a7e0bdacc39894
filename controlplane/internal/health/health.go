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
	// CheckTimeout bounds each readiness check (default DefaultCheckTimeout).
	CheckTimeout time.Duration
}

func (h *Handlers) GetHealth(context.Context, api.GetHealthRequestObject) (api.GetHealthResponseObject, error) {
	return api.GetHealth200JSONResponse{Body: api.HealthResponse{Ok: true}}, nil
}

// DefaultCheckTimeout bounds each readiness check when Handlers.CheckTimeout is zero.
const DefaultCheckTimeout = 2 * time.Second

// GetReadiness checks PostgreSQL and NATS at the same time, each with its own timeout,
// so that a slow or frozen database is reported as the database being down and not
// also as NATS (one shared budget let the ping use it up before the flush started).
func (h *Handlers) GetReadiness(ctx context.Context, _ api.GetReadinessRequestObject) (api.GetReadinessResponseObject, error) {
	pg, nc := make(chan api.ReadinessCheckStatus, 1), make(chan api.ReadinessCheckStatus, 1)
	go func() { pg <- h.check(ctx, h.pingPostgres) }()
	go func() { nc <- h.check(ctx, h.flushNATS) }()
	checks := api.ReadinessChecks{Postgres: <-pg, Nats: <-nc}
	body := api.ReadinessResponse{Checks: checks, Ok: checks.Postgres == api.ReadinessCheckStatusOk && checks.Nats == api.ReadinessCheckStatusOk}
	if !body.Ok {
		return api.GetReadiness503JSONResponse{Body: body}, nil
	}
	return api.GetReadiness200JSONResponse{Body: body}, nil
}

// check runs one readiness check under its own timeout. The context keeps the
// request's values but not its deadline: readiness must say which dependency is down,
// whatever budget the request had left.
func (h *Handlers) check(ctx context.Context, f func(context.Context) error) api.ReadinessCheckStatus {
	timeout := h.CheckTimeout
	if timeout <= 0 {
		timeout = DefaultCheckTimeout
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	if f(ctx) != nil {
		return api.ReadinessCheckStatusDown
	}
	return api.ReadinessCheckStatusOk
}

func (h *Handlers) pingPostgres(ctx context.Context) error { return h.Pool.Ping(ctx) }

func (h *Handlers) flushNATS(ctx context.Context) error {
	if h.NATS == nil || !h.NATS.IsConnected() {
		return nats.ErrConnectionClosed
	}
	return h.NATS.FlushWithContext(ctx)
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
