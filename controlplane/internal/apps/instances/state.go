package instances

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/gantry-gpu/gantry/controlplane/internal/apps/instances/lifecycle"
	"github.com/gantry-gpu/gantry/controlplane/internal/audit"
	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/outbox"
	"github.com/gantry-gpu/gantry/proto/fabric/apptask"
	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
	"github.com/gantry-gpu/gantry/shared/apierr"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Node task kinds (the agent's nodeagent/apps executes them).
const (
	TaskStart        = apptask.KindStart
	TaskStop         = apptask.KindStop
	TaskBootstrapSSH = apptask.KindBootstrapSSH
)

// Audit actions. Controller reports share one action of the seed's app_instance.*report
// family; the control plane's own moves are named after their event.
const (
	ActionCreate           = "app_instance.create"
	ActionControllerReport = "app_instance.controller_report"
	ActionBootstrapSSH     = "app_instance.bootstrap_ssh.reconcile"
)

// RunSpec is how an instance runs, fixed at launch (stored as run_spec).
type RunSpec struct {
	Kind string `json:"kind"`
	// Command is command[0] and its arguments, templated by the agent
	// (proto/fabric/apptask: {port}, {gpu_ids}, {home}, {base_path}, ...).
	Command         []string          `json:"command"`
	Env             map[string]string `json:"env"`
	Port            int               `json:"port"`
	Health          HealthCheck       `json:"health"`
	MinGPUs         int               `json:"min_gpus"`
	GPUModel        string            `json:"gpu_model,omitempty"`
	WholeAllocation bool              `json:"whole_allocation"`
	BootstrapSSH    bool              `json:"bootstrap_ssh"`
}

// BasePath is the URL path an instance is reached under through the app proxy.
func BasePath(id uuid.UUID) string { return "/api/v1/app-proxy/" + id.String() + "/" }

// move is one lifecycle event applied to an instance, with what the audit row says.
type move struct {
	event  lifecycle.Event
	reason string
	// actorType overrides the audit actor (audit.ActorNode, audit.ActorSystem); "" is
	// the caller in ctx.
	actorType string
	meta      map[string]any
}

func auditAction(e lifecycle.Event) string {
	if e.IsReport() {
		return ActionControllerReport
	}
	return "app_instance." + string(e)
}

// transition applies m to i, locked in tx. A change updates the row, enqueues the task
// the new state asks of the node, and writes the audit row and outbox event; a repeat
// writes nothing. A forbidden move returns its contract error.
func (s *Service) transition(ctx context.Context, tx pgx.Tx, i Instance, m move) (Instance, lifecycle.Outcome, error) {
	out, err := lifecycle.Apply(i.State, m.event)
	if err != nil || !out.Changed {
		return i, out, err
	}
	now := s.now()
	i.State, i.UpdatedAt = out.To, now
	i.StateReason = nil
	if m.reason != "" {
		r := truncate(m.reason, 1024)
		i.StateReason = &r
	}
	switch {
	case out.To == lifecycle.Running:
		i.NotReadySince, i.RunningAt = nil, &now
	case lifecycle.IsFinal(out.To):
		i.NotReadySince, i.EndedAt = nil, &now
	case out.To == lifecycle.Starting || out.To == lifecycle.Unhealthy:
		if i.NotReadySince == nil {
			i.NotReadySince = &now
		}
	}
	if _, err := tx.Exec(ctx, `UPDATE app_instances SET state = $2, state_reason = $3, not_ready_since = $4,
		running_at = $5, ended_at = $6, updated_at = $7 WHERE id = $1`,
		i.ID, string(i.State), i.StateReason, i.NotReadySince, i.RunningAt, i.EndedAt, now); err != nil {
		return i, out, fmt.Errorf("update app instance: %w", err)
	}
	// What the move asks of the node: a stop on a stop, and on a health timeout (the
	// process may still be there, crash-looping). A requested instance stopped while its
	// start task may be on the node gets a stop after it.
	switch {
	case out.To == lifecycle.Stopping, m.event == lifecycle.HealthTimeout:
		if _, err := s.enqueueStop(ctx, tx, i); err != nil {
			return i, out, err
		}
	case out.From == lifecycle.Requested && lifecycle.IsFinal(out.To):
		if err := s.cancelStart(ctx, tx, i); err != nil {
			return i, out, err
		}
	}
	// An allocation launched for the instance ends with it: the DELETE releases it as
	// the user (Stop; a stopping instance was released by it already); every other end
	// the node or the reconcile pass decides (a failure, a process the agent reports
	// gone, a stop nobody asked for) releases it here on the platform's account, so the
	// allocation does not keep its GPUs and billing running. An allocation that ended
	// by itself (AllocationEnded) is its owner's business.
	if releasesLaunched(m.event, out) && i.AllocationCreated {
		reason := "the app instance it was launched for " + string(out.To)
		if i.StateReason != nil {
			reason += ": " + truncate(*i.StateReason, 200)
		}
		_, err := s.Allocations.ReleaseAsSystem(db.WithTx(ctx, tx), i.ProjectID, i.AllocationID, reason)
		if e, ok := apierr.As(err); ok && (e.Code == apierr.AllocationAlreadyReleasing || e.Code == apierr.AllocationNotActive) {
			err = nil // on its way out already
		}
		if err != nil {
			return i, out, fmt.Errorf("release the allocation of a failed app instance: %w", err)
		}
	}
	meta := map[string]any{"from_state": string(out.From), "state": string(out.To), "event": string(m.event),
		"allocation_id": i.AllocationID.String(), "node_id": i.NodeID.String()}
	if m.reason != "" {
		meta["reason"] = truncate(m.reason, 256)
	}
	for k, v := range m.meta {
		meta[k] = v
	}
	if err := s.Audit.Record(ctx, tx, audit.Entry{
		Action: auditAction(m.event), TargetType: "app_instance", TargetID: i.ID.String(),
		TenantID: i.TenantID, ProjectID: i.ProjectID, Metadata: meta, ActorType: m.actorType,
	}); err != nil {
		return i, out, err
	}
	if err := s.publish(ctx, tx, i, string(out.From)); err != nil {
		return i, out, err
	}
	return i, out, nil
}

// releasesLaunched reports whether move out (made by event e) ends the instance
// without the user's DELETE, so the allocation launched for it must be released here.
func releasesLaunched(e lifecycle.Event, out lifecycle.Outcome) bool {
	return lifecycle.IsFinal(out.To) && e != lifecycle.Stop && e != lifecycle.AllocationEnded && out.From != lifecycle.Stopping
}

// publish enqueues app_instance.<state> (identifiers only).
func (s *Service) publish(ctx context.Context, tx pgx.Tx, i Instance, from string) error {
	typ := "app_instance." + string(i.State)
	payload := map[string]any{"app_instance_id": i.ID.String(), "project_id": i.ProjectID.String(),
		"allocation_id": i.AllocationID.String(), "state": string(i.State)}
	if from != "" {
		payload["from_state"] = from
	}
	if _, err := s.Outbox.Enqueue(ctx, tx, outbox.Event{Type: typ, Subject: "gantry.events." + typ, Payload: payload}); err != nil {
		return fmt.Errorf("enqueue %s: %w", typ, err)
	}
	return nil
}

// StartTask is the app.start payload of i (proto/fabric/apptask).
func (s *Service) StartTask(i Instance) (*fabricv1.AppStartTask, error) {
	var spec RunSpec
	if err := json.Unmarshal(i.RunSpec, &spec); err != nil {
		return nil, fmt.Errorf("run spec of %s: %w", i.ID, err)
	}
	startup := s.Config.HealthTimeout
	if spec.Health.StartupTimeoutSeconds > 0 {
		startup = time.Duration(spec.Health.StartupTimeoutSeconds) * time.Second
	}
	t := &fabricv1.AppStartTask{
		AppInstanceId: i.ID.String(), AllocationId: i.AllocationID.String(), AppSlug: i.AppSlug, Version: i.AppVersion,
		Command: spec.Command, Env: spec.Env, Port: uint32(i.Port), BasePath: BasePath(i.ID),
		StartupTimeout: durationpb.New(startup), MinGpus: uint32(max(spec.MinGPUs, 0)),
	}
	if h := spec.Health; h.Type != "" {
		t.HealthCheck = &fabricv1.AppHealthCheck{Type: h.Type, HttpPath: h.Path,
			Interval: durationpb.New(time.Duration(h.IntervalSeconds) * time.Second), Timeout: durationpb.New(time.Duration(h.TimeoutSeconds) * time.Second),
			FailureThreshold: uint32(max(h.FailureThreshold, 0))}
	}
	if err := apptask.ValidateStart(t); err != nil {
		return nil, fmt.Errorf("app.start payload of %s: %w", i.ID, err)
	}
	return t, nil
}

func (s *Service) enqueueStart(ctx context.Context, tx pgx.Tx, i Instance) (uuid.UUID, error) {
	t, err := s.StartTask(i)
	if err != nil {
		return uuid.Nil, err
	}
	// The artifacts' files and digests are pinned now: the agent places exactly these
	// bytes, and a file changed since fails the start (artifact_digest_mismatch).
	if len(i.ArtifactIDs) > 0 {
		if s.Artifacts == nil {
			return uuid.Nil, apierr.Validation("artifact_ids", "artifacts are not available").With("reason", "artifact_not_found")
		}
		if t.Artifacts, err = s.Artifacts.Mounts(db.WithTx(ctx, tx), i.ProjectID, i.ArtifactIDs); err != nil {
			return uuid.Nil, err
		}
		if err := apptask.ValidateStart(t); err != nil {
			return uuid.Nil, fmt.Errorf("app.start payload of %s: %w", i.ID, err)
		}
	}
	return s.enqueueTask(ctx, tx, i, TaskStart, t)
}

// requestStart enqueues the instance's app.start (and its bootstrap SSH trust when the
// version asks for it) unless a start task is pending or succeeded already.
func (s *Service) requestStart(ctx context.Context, tx pgx.Tx, i Instance, publicKeys []string) error {
	var live bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM app_instance_tasks WHERE instance_id = $1 AND kind = 'app.start'
		AND (finished_at IS NULL OR succeeded))`, i.ID).Scan(&live); err != nil {
		return fmt.Errorf("start tasks: %w", err)
	}
	if live {
		return nil
	}
	if _, err := s.enqueueStart(ctx, tx, i); err != nil {
		return err
	}
	if i.BootstrapSSH {
		if _, err := s.reconcileSSH(ctx, tx, i, publicKeys); err != nil {
			return err
		}
	}
	return nil
}

// cancelStart settles the instance's undelivered start tasks, and enqueues a stop when
// one may have reached the node (delivered, or tried).
func (s *Service) cancelStart(ctx context.Context, tx pgx.Tx, i Instance) error {
	var reached bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM app_instance_tasks WHERE instance_id = $1 AND kind = 'app.start'
		AND (acked_at IS NOT NULL OR attempts > 0))`, i.ID).Scan(&reached); err != nil {
		return fmt.Errorf("start tasks: %w", err)
	}
	if _, err := tx.Exec(ctx, `UPDATE app_instance_tasks SET finished_at = $2, succeeded = false, last_error = 'superseded: the instance ended'
		WHERE instance_id = $1 AND kind = 'app.start' AND acked_at IS NULL AND finished_at IS NULL`, i.ID, s.now()); err != nil {
		return fmt.Errorf("cancel start tasks: %w", err)
	}
	if !reached {
		return nil
	}
	_, err := s.enqueueStop(ctx, tx, i)
	return err
}

func (s *Service) enqueueStop(ctx context.Context, tx pgx.Tx, i Instance) (uuid.UUID, error) {
	return s.enqueueTask(ctx, tx, i, TaskStop, &fabricv1.AppStopTask{AppInstanceId: i.ID.String(), AllocationId: i.AllocationID.String()})
}

// enqueueTask stores a node task for i (a protobuf payload for app.start/app.stop, JSON
// otherwise); the reconcile pass delivers it.
func (s *Service) enqueueTask(ctx context.Context, tx pgx.Tx, i Instance, kind string, payload any) (uuid.UUID, error) {
	var body []byte
	var err error
	contentType := apptask.ContentType
	if m, ok := payload.(proto.Message); ok {
		body, err = apptask.Encode(m)
	} else {
		contentType = apptask.ContentTypeJSON
		body, err = json.Marshal(payload)
	}
	if err != nil {
		return uuid.Nil, fmt.Errorf("task payload: %w", err)
	}
	id := s.IDs.New()
	if _, err := tx.Exec(ctx, `INSERT INTO app_instance_tasks (task_id, instance_id, node_id, kind, payload, content_type, created_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7)`, id, i.ID, i.NodeID, kind, body, contentType, s.now()); err != nil {
		return uuid.Nil, fmt.Errorf("insert %s task: %w", kind, err)
	}
	return id, nil
}

// within runs fn in the ambient transaction of ctx (the idempotency layer's) or in one of
// its own.
func (s *Service) within(ctx context.Context, fn func(tx pgx.Tx) error) error {
	if tx, ok := dbTx(ctx); ok {
		return fn(tx)
	}
	return inTx(ctx, s.Pool, fn)
}
