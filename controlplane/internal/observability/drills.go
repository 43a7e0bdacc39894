package observability

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/gantry-gpu/gantry/controlplane/internal/audit"
	"github.com/gantry-gpu/gantry/controlplane/internal/auth"
	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/observability/observabilitydb"
	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/proto/api"
	"github.com/gantry-gpu/gantry/shared/apierr"
	"github.com/gantry-gpu/gantry/shared/clock"
	"github.com/gantry-gpu/gantry/shared/ids"
)

// DrillAlertName is the alertname of every drill: it is routed by its team labels like
// the alert it stands in for, and never mistaken for that alert.
const DrillAlertName = "GantryAlertDrill"

// drillArrivalTimeout is how long a drill may take to arrive before it counts as
// failed (Alertmanager's group_wait is 30s; a minute of grace on top).
const drillArrivalTimeout = 2 * time.Minute

// Drills fires drills through Alertmanager and records their arrival at the control
// plane's alert receiver; it is the DrillEvidence of the read models.
type Drills struct {
	Pool     *pgxpool.Pool
	Clock    clock.Clock
	IDs      ids.Source
	Audit    *audit.Log
	AM       *Alertmanager
	Manifest *Manifest
	// TokenFile holds the bearer Alertmanager presents to the receiver.
	TokenFile string
}

// Latest is the drill evidence per receiver: the latest arrival, and the receivers
// with a drill still within its arrival window.
func (d *Drills) Latest(ctx context.Context) (map[string]time.Time, map[string]bool, error) {
	q := observabilitydb.New(d.Pool)
	rows, err := q.LatestArrivals(ctx)
	if err != nil {
		return nil, nil, err
	}
	arrived := make(map[string]time.Time, len(rows))
	for _, r := range rows {
		arrived[r.Receiver] = r.LastArrivedAt
	}
	recv, err := q.PendingReceivers(ctx, d.Clock.Now().Add(-drillArrivalTimeout))
	if err != nil {
		return nil, nil, err
	}
	pending := make(map[string]bool, len(recv))
	for _, r := range recv {
		pending[r] = true
	}
	return arrived, pending, nil
}

// drillLabels are the labels a drill standing in for alertName carries: the alert's
// routing labels (team, severity, service, domain), the drill's id, and its own name.
func (d *Drills) drillLabels(alertName string, id uuid.UUID) (map[string]string, error) {
	labels := map[string]string{"owner_team": "platform", "severity": "warning", "service": "observability",
		"domain": "observability"}
	if alertName != DrillAlertName {
		r, ok := d.Manifest.Alert(alertName)
		if !ok {
			return nil, apierr.New(apierr.ValidationError, "no alert rule named %q", alertName).
				With("field", "alert_name").With("reason", "alert_not_in_manifest")
		}
		for _, k := range []string{"owner_team", "severity", "service", "domain"} {
			labels[k] = r.Labels[k]
		}
	}
	labels["alertname"] = DrillAlertName
	labels["drill_for"] = alertName
	labels["drill_id"] = id.String()
	labels["runbook_id"] = "ops.alerting.drill"
	return labels, nil
}

// Fire records a drill and sends it to Alertmanager. The row is committed (and audited)
// before the alert leaves, so an arrival can never precede its drill; a drill that
// Alertmanager refused stays recorded and turns failed after the arrival window.
func (d *Drills) Fire(ctx context.Context, alertName string) (api.ObservabilityDrill, error) {
	if d.AM == nil {
		return api.ObservabilityDrill{}, apierr.New(apierr.ServiceUnavailable, "no Alertmanager is configured (GANTRY_ALERTMANAGER_URL)")
	}
	id := d.IDs.New()
	labels, err := d.drillLabels(alertName, id)
	if err != nil {
		return api.ObservabilityDrill{}, err
	}
	routing, err := d.AM.Routing(ctx)
	if err != nil {
		return api.ObservabilityDrill{}, apierr.New(apierr.ServiceUnavailable, "alertmanager unreachable").Wrap(err)
	}
	receiver := ""
	for _, r := range routing.Root.Receivers(labels) {
		if routing.Delivering[r] {
			receiver = r
			break
		}
	}
	if receiver == "" {
		return api.ObservabilityDrill{}, apierr.New(apierr.ValidationError, "no Alertmanager route delivers alert %s", alertName).
			With("field", "alert_name").With("reason", "route_missing")
	}
	now := d.Clock.Now().UTC()
	var firedBy uuid.NullUUID
	if p, ok := principal.From(ctx); ok && p.UserID != uuid.Nil {
		firedBy = uuid.NullUUID{UUID: p.UserID, Valid: true}
	}
	err = db.InTx(ctx, d.Pool, func(tx pgx.Tx) error {
		if err := observabilitydb.New(tx).InsertDrill(ctx, observabilitydb.InsertDrillParams{
			DrillID: id, AlertName: alertName, Receiver: receiver, FiredBy: firedBy, FiredAt: now}); err != nil {
			return err
		}
		return d.Audit.Record(ctx, tx, audit.Entry{Action: "observability.drill.fire", TargetType: "observability_drill",
			TargetID: id.String(), Metadata: map[string]any{"alert_name": alertName, "receiver": receiver}})
	})
	if err != nil {
		return api.ObservabilityDrill{}, err
	}
	annotations := map[string]string{"summary": "Alert routing drill for " + alertName,
		"description": "A test alert fired by an operator; it proves the route to " + receiver + " delivers.",
		"runbook_id":  "ops.alerting.drill"}
	if err := d.AM.Post(ctx, labels, annotations, now, now.Add(drillArrivalTimeout)); err != nil {
		return api.ObservabilityDrill{}, apierr.New(apierr.UpstreamError, "alertmanager refused the drill").Wrap(err)
	}
	return api.ObservabilityDrill{DrillID: id, AlertName: alertName, FiredAt: now, State: api.ObservabilityDrillStatePending}, nil
}

// Receive records a notification Alertmanager delivered to receiver: the drills it
// carries have arrived.
func (d *Drills) Receive(ctx context.Context, n api.AlertmanagerNotification) error {
	now := d.Clock.Now().UTC()
	return db.InTx(ctx, d.Pool, func(tx pgx.Tx) error {
		q := observabilitydb.New(tx)
		for _, a := range n.Alerts {
			if a.Labels["alertname"] != DrillAlertName || a.Status != "firing" {
				continue
			}
			raw, _ := a.Labels["drill_id"].(string)
			id, err := uuid.Parse(raw)
			if err != nil {
				continue // not one of ours: ignored, never trusted
			}
			at := now
			marked, err := q.MarkDrillArrived(ctx, observabilitydb.MarkDrillArrivedParams{DrillID: id, Receiver: n.Receiver, ArrivedAt: &at})
			if err != nil {
				return err
			}
			if marked == 1 {
				if err := d.Audit.Record(ctx, tx, audit.Entry{Action: "observability.drill.arrive", TargetType: "observability_drill",
					TargetID: id.String(), ActorType: audit.ActorSystem, Metadata: map[string]any{"receiver": n.Receiver}}); err != nil {
					return err
				}
			}
		}
		return nil
	})
}

// checkReceiverToken compares the presented bearer with the token file's content, as
// SHA-256 digests in constant time. No file configured: every delivery is refused.
func (d *Drills) checkReceiverToken(ctx context.Context) error {
	bad := apierr.New(apierr.TokenInvalid, "alert receiver token is missing or wrong")
	if d.TokenFile == "" {
		return bad
	}
	raw, err := os.ReadFile(d.TokenFile)
	if err != nil {
		return apierr.New(apierr.ServiceUnavailable, "alert receiver token unreadable").Wrap(err)
	}
	presented, _ := ctx.Value(receiverBearerKey{}).(string)
	if presented == "" {
		return bad
	}
	want := sha256.Sum256([]byte(strings.TrimSpace(string(raw))))
	got := sha256.Sum256([]byte(presented))
	if subtle.ConstantTimeCompare(want[:], got[:]) != 1 {
		return bad
	}
	return nil
}

type receiverBearerKey struct{}

// StrictMiddleware is an api.StrictMiddlewareFunc: for the alert receiver it puts the
// request's bearer on the context, since the strict request object carries no
// Authorization header. Mount it in api.NewStrictHandlerWithOptions.
func (h *Handlers) StrictMiddleware(f api.StrictHandlerFunc, operationID string) api.StrictHandlerFunc {
	if operationID != "ReceiveAlertNotification" {
		return f
	}
	return func(ctx context.Context, w http.ResponseWriter, r *http.Request, request any) (any, error) {
		if token, found, err := auth.BearerToken(r); err == nil && found {
			ctx = context.WithValue(ctx, receiverBearerKey{}, token)
		}
		return f(ctx, w, r, request)
	}
}

// CreateObservabilityDrill is POST /api/v1/v3/platform/ops/observability/drills.
func (h *Handlers) CreateObservabilityDrill(ctx context.Context, req api.CreateObservabilityDrillRequestObject) (api.CreateObservabilityDrillResponseObject, error) {
	if h.Drills == nil {
		return nil, apierr.New(apierr.ServiceUnavailable, "drills are not available")
	}
	name := DrillAlertName
	if req.Body != nil && req.Body.AlertName != nil {
		name = *req.Body.AlertName
	}
	dr, err := h.Drills.Fire(ctx, name)
	if err != nil {
		var ae *apierr.Error
		if errors.As(err, &ae) {
			return nil, err
		}
		return nil, fmt.Errorf("fire drill: %w", err)
	}
	return api.CreateObservabilityDrill202JSONResponse{Body: dr}, nil
}

// ReceiveAlertNotification is POST /api/v1/internal/alerts/receiver.
func (h *Handlers) ReceiveAlertNotification(ctx context.Context, req api.ReceiveAlertNotificationRequestObject) (api.ReceiveAlertNotificationResponseObject, error) {
	if h.Drills == nil {
		return nil, apierr.New(apierr.TokenInvalid, "alert receiver token is missing or wrong")
	}
	if err := h.Drills.checkReceiverToken(ctx); err != nil {
		return nil, err
	}
	if req.Body == nil {
		return nil, apierr.New(apierr.InvalidRequest, "request body is required")
	}
	if err := h.Drills.Receive(ctx, *req.Body); err != nil {
		return nil, err
	}
	return api.ReceiveAlertNotification204Response{}, nil
}
