package audit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gantry-gpu/gantry/controlplane/internal/bearer"
	"github.com/gantry-gpu/gantry/controlplane/internal/ratelimit"
	"github.com/gantry-gpu/gantry/shared/clock"
	"github.com/gantry-gpu/gantry/shared/correlation"
	"github.com/gantry-gpu/gantry/shared/ids"
)

// ActionDenied is the audit action of refused requests: every 401 (authentication) and
// 403 (authorization) answer of the API, aggregated (see Denials).
const ActionDenied = "auth.denied"

// Denial is one refused request, as the HTTP layer saw it.
type Denial struct {
	// ActorType is ActorUser or ActorNode: who the operation is for. The actor itself is
	// ActorUserID, uuid.Nil when the caller did not authenticate (then IP names it).
	ActorType   string
	ActorUserID uuid.UUID
	TenantID    uuid.UUID
	// ProjectID is the project the request named (header or path), uuid.Nil if none.
	ProjectID     uuid.UUID
	IP            string
	Method        string
	Route         string // the path template, never the raw path
	OperationID   string
	Code          string // the error code answered (token_missing, admin_required, ...)
	Status        int
	CorrelationID string
}

// Observer records denials: *Denials.
type Observer interface {
	Observe(Denial)
}

// Deny is the common part of answering a refusal (401, 403) that the server's error
// mapper never sees (a WebSocket handshake): it fills in the request's client address,
// method and correlation id, logs a 401 as a warning-class incident (seed §7.1 rule 4)
// and sets its challenge (presented: the request carried a credential of the endpoint,
// RFC 6750 §3.1), and hands the denial to rec (nil: not audited). The caller writes the
// envelope.
func Deny(w http.ResponseWriter, r *http.Request, log *slog.Logger, rec Observer, den Denial, presented bool) {
	den.IP, den.Method, den.CorrelationID = ratelimit.ClientIP(r), r.Method, correlation.ID(r.Context())
	if den.Status == http.StatusUnauthorized {
		log.WarnContext(r.Context(), "authentication failed", "code", den.Code, "method", r.Method, "route", den.Route)
		w.Header().Set("WWW-Authenticate", bearer.Challenge(presented))
	}
	if rec != nil {
		rec.Observe(den)
	}
}

// DenialConfig bounds the aggregation. Zero fields take the defaults.
type DenialConfig struct {
	// Window is the aggregation window (default 1m): at most one row per actor, route and
	// code per window and replica.
	Window time.Duration
	// MaxKeys is the most distinct actor × route × code aggregates per window (default
	// 10,000); denials beyond it are counted in one overflow aggregate per route and code
	// whose actor is not named, so a flood from many addresses cannot grow memory or rows.
	MaxKeys int
	// MaxPending is the most rows kept for writing while the database refuses them
	// (default 4 × MaxKeys); older ones are dropped and counted.
	MaxPending int
	// WriteTimeout bounds one flush (default 5s).
	WriteTimeout time.Duration
	// FlushEvery is how often Run writes closed windows (default 10s).
	FlushEvery time.Duration
}

func (c DenialConfig) withDefaults() DenialConfig {
	if c.Window <= 0 {
		c.Window = time.Minute
	}
	if c.MaxKeys <= 0 {
		c.MaxKeys = 10_000
	}
	if c.MaxPending <= 0 {
		c.MaxPending = 4 * c.MaxKeys
	}
	if c.WriteTimeout <= 0 {
		c.WriteTimeout = 5 * time.Second
	}
	if c.FlushEvery <= 0 {
		c.FlushEvery = 10 * time.Second
	}
	return c
}

// Denials audits refused requests without letting them cost the request anything or
// fill the table. Observe only counts, in memory, under a mutex: the request that is
// denied never waits on the database and never fails because of it. Repeats of one
// actor (the user, or the client IP when none authenticated) on one route with one code
// inside one window are one aggregate; when the window has closed, Flush writes each
// aggregate as ONE audit row (result failure, action auth.denied) whose metadata carries
// count, first_seen and last_seen. The audit table stays append-only: nothing is ever
// updated; the counting happens before the row exists.
//
// What is bounded and what is traded: rows per window ≤ MaxKeys plus one overflow row
// per route and code, per replica; memory likewise. A denial is in the table at most
// Window + FlushEvery after it happened; a replica killed before flushing loses its
// open window (a clean stop flushes it). Rows that cannot be written (database down)
// are retried at the next flush, up to MaxPending, then dropped and counted in
// audit_denial_rows_dropped_total — the one honest place where a long outage shows.
type Denials struct {
	pool  *pgxpool.Pool
	clock clock.Clock
	ids   ids.Source
	log   *slog.Logger
	cfg   DenialConfig

	denied  *prometheus.CounterVec
	written prometheus.Counter
	dropped prometheus.Counter

	mu      sync.Mutex
	window  time.Time // start of the open window
	open    map[denialKey]*denialAgg
	pending []*denialAgg // closed, not yet written, oldest first
}

// NewDenials returns the denial audit; reg (may be nil) gets its metrics.
func NewDenials(pool *pgxpool.Pool, clk clock.Clock, idSrc ids.Source, log *slog.Logger, cfg DenialConfig, reg prometheus.Registerer) (*Denials, error) {
	d := &Denials{
		pool: pool, clock: clk, ids: idSrc, log: log, cfg: cfg.withDefaults(),
		open: map[denialKey]*denialAgg{},
		denied: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "api_auth_denials_total",
			Help: "Requests answered 401 or 403, by error code (each is aggregated into the audit log as auth.denied).",
		}, []string{"code"}),
		written: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "audit_denial_rows_written_total",
			Help: "auth.denied audit rows written (one per actor, route and code per window).",
		}),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "audit_denial_rows_dropped_total",
			Help: "auth.denied audit rows dropped because the database refused them for longer than the pending bound.",
		}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{d.denied, d.written, d.dropped} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("denial audit metrics: %w", err)
			}
		}
	}
	return d, nil
}

type denialKey struct {
	actor, method, route, code string
}

// maxProjectsPerAggregate bounds the project ids one aggregate remembers.
const maxProjectsPerAggregate = 10

type denialAgg struct {
	first       Denial
	overflow    bool
	window      time.Time
	count       int64
	firstSeen   time.Time
	lastSeen    time.Time
	lastCorr    string
	projects    []uuid.UUID
	projectsCut bool
}

// Observe counts one denial. It never blocks on anything but a short mutex.
func (d *Denials) Observe(den Denial) {
	if d == nil {
		return
	}
	d.denied.WithLabelValues(den.Code).Inc()
	now := d.clock.Now()
	start := now.Truncate(d.cfg.Window)
	actor := "ip:" + den.IP
	if den.ActorUserID != uuid.Nil {
		actor = "user:" + den.ActorUserID.String()
	}
	k := denialKey{actor: actor, method: den.Method, route: den.Route, code: den.Code}

	d.mu.Lock()
	defer d.mu.Unlock()
	if !start.Equal(d.window) {
		d.closeLocked()
		d.window = start
	}
	agg, ok := d.open[k]
	if !ok && len(d.open) >= d.cfg.MaxKeys {
		k.actor = "*"
		agg, ok = d.open[k]
		if !ok {
			agg = &denialAgg{first: den, overflow: true, window: start, firstSeen: now}
			agg.first.ActorUserID, agg.first.TenantID, agg.first.IP = uuid.Nil, uuid.Nil, ""
			d.open[k] = agg // the one key allowed past MaxKeys per route and code
		}
	} else if !ok {
		agg = &denialAgg{first: den, window: start, firstSeen: now}
		d.open[k] = agg
	}
	agg.count++
	agg.lastSeen = now
	agg.lastCorr = den.CorrelationID
	if den.ProjectID != uuid.Nil && !slices.Contains(agg.projects, den.ProjectID) {
		if len(agg.projects) < maxProjectsPerAggregate {
			agg.projects = append(agg.projects, den.ProjectID)
		} else {
			agg.projectsCut = true
		}
	}
}

// closeLocked moves the open window's aggregates to pending.
func (d *Denials) closeLocked() {
	for _, a := range d.open {
		d.pending = append(d.pending, a)
	}
	clear(d.open)
	d.trimLocked()
}

// trimLocked drops the oldest pending rows beyond MaxPending.
func (d *Denials) trimLocked() {
	if over := len(d.pending) - d.cfg.MaxPending; over > 0 {
		d.dropped.Add(float64(over))
		d.pending = append(d.pending[:0:0], d.pending[over:]...)
	}
}

// Flush writes the aggregates of every window that has closed.
func (d *Denials) Flush(ctx context.Context) error { return d.flush(ctx, false) }

// FlushAll closes the open window too and writes everything (shutdown, tests).
func (d *Denials) FlushAll(ctx context.Context) error { return d.flush(ctx, true) }

func (d *Denials) flush(ctx context.Context, all bool) error {
	if d == nil {
		return nil
	}
	d.mu.Lock()
	if len(d.open) > 0 && (all || !d.clock.Now().Before(d.window.Add(d.cfg.Window))) {
		d.closeLocked()
	}
	batch := d.pending
	d.pending = nil
	d.mu.Unlock()
	if len(batch) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, d.cfg.WriteTimeout)
	defer cancel()
	if err := d.write(ctx, batch); err != nil {
		d.mu.Lock()
		d.pending = append(batch, d.pending...) // retried next time, oldest first
		d.trimLocked()
		d.mu.Unlock()
		return err
	}
	d.written.Add(float64(len(batch)))
	return nil
}

var auditColumns = []string{"id", "occurred_at", "actor_type", "actor_user_id", "tenant_id", "project_id",
	"action", "target_type", "target_id", "result", "correlation_id", "metadata"}

// write inserts the rows with one COPY: all or none.
func (d *Denials) write(ctx context.Context, batch []*denialAgg) error {
	rows := make([][]any, 0, len(batch))
	for _, a := range batch {
		row, err := d.row(a)
		if err != nil {
			return err
		}
		rows = append(rows, row)
	}
	_, err := d.pool.CopyFrom(ctx, pgx.Identifier{"audit_events"}, auditColumns, pgx.CopyFromRows(rows))
	if err != nil {
		return fmt.Errorf("write %d auth.denied rows: %w", len(rows), err)
	}
	return nil
}

func (d *Denials) row(a *denialAgg) ([]any, error) {
	f := a.first
	meta := map[string]any{
		"code": f.Code, "status": f.Status, "method": f.Method, "route": f.Route,
		"count":        a.count,
		"first_seen":   a.firstSeen.UTC().Format(time.RFC3339Nano),
		"last_seen":    a.lastSeen.UTC().Format(time.RFC3339Nano),
		"window_start": a.window.UTC().Format(time.RFC3339), "window_seconds": int64(d.cfg.Window / time.Second),
	}
	if f.OperationID != "" {
		meta["operation_id"] = f.OperationID
	}
	if f.IP != "" {
		meta["ip"] = f.IP
	}
	if a.count > 1 && a.lastCorr != "" {
		meta["last_correlation_id"] = a.lastCorr
	}
	if a.overflow {
		meta["overflow"] = true
	}
	var project uuid.UUID
	switch {
	case len(a.projects) == 1 && !a.projectsCut:
		project = a.projects[0]
	case len(a.projects) > 1:
		meta["project_ids"] = a.projects
		if a.projectsCut {
			meta["project_ids_truncated"] = true
		}
	}
	metaJSON, err := json.Marshal(meta)
	if err != nil {
		return nil, fmt.Errorf("denial metadata: %w", err)
	}
	actorType := f.ActorType
	if actorType == "" {
		actorType = ActorUser
	}
	corr := f.CorrelationID
	if corr == "" {
		corr = "unknown"
	}
	target := f.Method + " " + f.Route
	return []any{
		d.ids.New(), a.firstSeen, actorType, nullable(f.ActorUserID), nullable(f.TenantID), nullable(project),
		ActionDenied, "operation", &target, Failure, corr, metaJSON,
	}, nil
}

// Run flushes closed windows every FlushEvery until ctx ends, then flushes everything
// once more within WriteTimeout.
func (d *Denials) Run(ctx context.Context) {
	if d == nil {
		return
	}
	t := time.NewTicker(d.cfg.FlushEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			if err := d.FlushAll(context.WithoutCancel(ctx)); err != nil {
				d.log.Warn("denial audit: final flush failed", "err", err)
			}
			return
		case <-t.C:
			if err := d.Flush(ctx); err != nil && !errors.Is(err, context.Canceled) {
				d.log.WarnContext(ctx, "denial audit: flush failed; retried next time", "err", err)
			}
		}
	}
}
