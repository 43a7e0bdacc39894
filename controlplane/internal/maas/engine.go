package maas

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// StepArgs is the River job that runs one step of one workflow. Attempt is the step's
// attempt count when the job was inserted: a job left over from an earlier attempt (a
// retry raced it) finds the step moved on and does nothing.
type StepArgs struct {
	Workflow string    `json:"workflow"`
	ID       uuid.UUID `json:"id"`
	Step     string    `json:"step"`
	Attempt  int       `json:"attempt"`
}

// Kind implements river.JobArgs.
func (StepArgs) Kind() string { return "maas_step" }

// InsertOpts makes each (workflow, step, attempt) one job: inserting it twice is a no-op.
func (StepArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{MaxAttempts: 50, UniqueOpts: river.UniqueOpts{ByArgs: true}}
}

// StepWorker runs workflow steps.
type StepWorker struct {
	river.WorkerDefaults[StepArgs]
	Svc *Service
}

// Work implements river.Worker.
func (w *StepWorker) Work(ctx context.Context, job *river.Job[StepArgs]) error {
	return w.Svc.RunStep(ctx, job.Args)
}

// Timeout bounds one attempt: a few MAAS calls (Config.StepAttemptTimeout). River's
// rescuer also waits this long before it takes a killed replica's running job for lost.
func (w *StepWorker) Timeout(*river.Job[StepArgs]) time.Duration {
	if d := w.Svc.Config.StepAttemptTimeout; d > 0 {
		return d
	}
	return DefaultStepAttemptTimeout
}

func table(kind string) string {
	if kind == KindDecommission {
		return "maas_decommissions"
	}
	return "maas_onboardings"
}

// wfRow is the common part of a workflow row.
type wfRow struct {
	Kind        string
	ID          uuid.UUID
	State       string
	CurrentStep *string
	Steps       []Step
	CreatedAt   time.Time
}

func loadRow(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, kind string, id uuid.UUID, lock bool) (wfRow, error) {
	sql := `SELECT state, current_step, steps, created_at FROM ` + table(kind) + ` WHERE id = $1`
	if lock {
		sql += ` FOR UPDATE`
	}
	r := wfRow{Kind: kind, ID: id}
	var raw []byte
	if err := q.QueryRow(ctx, sql, id).Scan(&r.State, &r.CurrentStep, &raw, &r.CreatedAt); err != nil {
		return r, err
	}
	if err := json.Unmarshal(raw, &r.Steps); err != nil {
		return r, fmt.Errorf("maas: steps of %s %s: %w", kind, id, err)
	}
	return r, nil
}

func (s *Service) saveRow(ctx context.Context, tx pgx.Tx, r wfRow, failure *string, finished bool) error {
	raw, err := json.Marshal(r.Steps)
	if err != nil {
		return err
	}
	now := s.now()
	var fin *time.Time
	if finished {
		fin = &now
	}
	_, err = tx.Exec(ctx, `UPDATE `+table(r.Kind)+` SET state = $2, current_step = $3, steps = $4, failure_reason = $5,
		updated_at = $6, finished_at = COALESCE($7, finished_at) WHERE id = $1`, r.ID, r.State, r.CurrentStep, raw, failure, now, fin)
	return err
}

// enqueue inserts the job that runs r's current step, in tx.
func (s *Service) enqueue(ctx context.Context, tx pgx.Tx, r wfRow) error {
	if r.CurrentStep == nil {
		return nil
	}
	attempt := 0
	if i := stepIndex(r.Steps, *r.CurrentStep); i >= 0 {
		attempt = r.Steps[i].Attempts
	}
	if s.Jobs == nil {
		return errors.New("maas: no job runner")
	}
	_, err := s.Jobs.InsertTx(ctx, tx, StepArgs{Workflow: r.Kind, ID: r.ID, Step: *r.CurrentStep, Attempt: attempt}, nil)
	return err
}

// RunStep runs one step once: it finishes it (and starts the next, inserting its job in
// the same transaction), fails the workflow, or snoozes the job to look again.
func (s *Service) RunStep(ctx context.Context, a StepArgs) error {
	r, err := loadRow(ctx, s.Pool, a.Workflow, a.ID, false)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	if err != nil {
		return err
	}
	if a.Step == StepAbort {
		if r.State != StateAborting {
			return nil
		}
		return s.runAbort(ctx, r)
	}
	if r.State != StateRunning || r.CurrentStep == nil || *r.CurrentStep != a.Step {
		return nil // stale: the workflow moved on
	}
	i := stepIndex(r.Steps, a.Step)
	if i < 0 || r.Steps[i].Attempts != a.Attempt {
		return nil
	}
	st := r.Steps[i]
	if st.DeadlineAt != nil && s.now().After(*st.DeadlineAt) {
		return s.failStep(ctx, r, a, fmt.Sprintf("step %s timed out after %s", a.Step, s.stepTimeout(a.Step)))
	}
	var out Outcome
	if a.Workflow == KindOnboarding {
		out, err = s.onboardingStep(ctx, a.ID, a.Step)
	} else {
		out, err = s.decommissionStep(ctx, a.ID, a.Step)
	}
	if err != nil {
		if ae, ok := apierr.As(err); ok && ae.Code != apierr.UpstreamError && ae.Code != apierr.InternalError && ae.Code != apierr.ServiceUnavailable {
			return s.failStep(ctx, r, a, ae.Message)
		}
		// Transient (MAAS unreachable, a database hiccup): look again; the step's
		// deadline ends it if it lasts.
		s.Log.WarnContext(ctx, "maas step will be retried", "workflow", a.Workflow, "id", a.ID, "step", a.Step, "err", err)
		reason := "retrying: " + publicReason(err)
		s.noteWait(ctx, r, a, reason)
		return river.JobSnooze(s.Config.PollInterval)
	}
	switch {
	case out.Fail:
		return s.failStep(ctx, r, a, out.Reason)
	case out.Done:
		return s.advance(ctx, a, out)
	default:
		s.noteWait(ctx, r, a, out.Reason)
		return river.JobSnooze(s.Config.PollInterval)
	}
}

// publicReason is an error's words fit for the step record (never MAAS's raw text).
func publicReason(err error) string {
	if ae, ok := apierr.As(err); ok {
		return ae.Message
	}
	return "internal error"
}

// noteWait records what a running step waits for (no state change: not audited).
func (s *Service) noteWait(ctx context.Context, r wfRow, a StepArgs, reason string) {
	i := stepIndex(r.Steps, a.Step)
	if reason == "" || (r.Steps[i].Reason != nil && *r.Steps[i].Reason == reason) {
		return
	}
	_, err := s.Pool.Exec(ctx, `UPDATE `+table(a.Workflow)+` SET steps = jsonb_set(steps, $2, to_jsonb($3::text)), updated_at = $4
		WHERE id = $1 AND state = 'running' AND current_step = $5`, a.ID, []string{fmt.Sprint(i), "reason"}, reason, s.now(), a.Step)
	if err != nil {
		s.Log.WarnContext(ctx, "maas step note", "err", err)
	}
}

// advance records the step's end and starts the next one, in one transaction.
func (s *Service) advance(ctx context.Context, a StepArgs, out Outcome) error {
	var finishedWF bool
	var dur time.Duration
	err := db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		r, err := loadRow(ctx, tx, a.Workflow, a.ID, true)
		if err != nil {
			return err
		}
		i := stepIndex(r.Steps, a.Step)
		if r.State != StateRunning || r.CurrentStep == nil || *r.CurrentStep != a.Step || r.Steps[i].Attempts != a.Attempt {
			return nil
		}
		if out.Apply != nil {
			if err := out.Apply(db.WithTx(ctx, tx), tx); err != nil {
				return err
			}
		}
		now := s.now()
		if r.Steps[i].StartedAt != nil {
			dur = now.Sub(*r.Steps[i].StartedAt)
		}
		state := StateSucceeded
		if out.Skip {
			state = StepSkipped
		}
		finish(r.Steps, i, state, now, out.Reason)
		next := out.Next
		if next == "" && i+1 < len(r.Steps) {
			next = r.Steps[i+1].Name
		}
		meta := map[string]any{"step": a.Step, "result": state}
		if next == "" {
			to, _ := transition(r.State, "finish")
			r.State, r.CurrentStep = to, nil
			finishedWF = true
		} else {
			j := stepIndex(r.Steps, next)
			for k := i + 1; k < j; k++ { // steps jumped over
				finish(r.Steps, k, StepSkipped, now, "not needed")
			}
			start(r.Steps, j, now, s.stepTimeout(next))
			r.CurrentStep = &next
			meta["next_step"] = next
		}
		if err := s.saveRow(ctx, tx, r, nil, finishedWF); err != nil {
			return err
		}
		if err := s.enqueue(ctx, tx, r); err != nil {
			return err
		}
		if err := s.changed(ctx, tx, "maas."+a.Workflow+".step", "maas_"+a.Workflow, a.ID.String(), "maas."+a.Workflow+".step_finished", meta); err != nil {
			return err
		}
		if s.BeforeCommit != nil {
			if err := s.BeforeCommit(ctx, a.Workflow, a.ID, a.Step); err != nil {
				return err
			}
		}
		if finishedWF {
			return s.changed(ctx, tx, "maas."+a.Workflow+".succeed", "maas_"+a.Workflow, a.ID.String(), "maas."+a.Workflow+".succeeded", nil)
		}
		return nil
	})
	if err != nil {
		if ae, ok := apierr.As(err); ok && ae.Code != apierr.InternalError {
			r, lerr := loadRow(ctx, s.Pool, a.Workflow, a.ID, false)
			if lerr != nil {
				return lerr
			}
			return s.failStep(ctx, r, a, ae.Message)
		}
		return err
	}
	s.Metrics.step(a.Workflow, a.Step, "succeeded", dur)
	if finishedWF {
		s.Metrics.outcome(a.Workflow, StateSucceeded)
	}
	return nil
}

// failStep fails the step and the workflow with reason.
func (s *Service) failStep(ctx context.Context, _ wfRow, a StepArgs, reason string) error {
	var dur time.Duration
	var failed bool
	err := db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		r, err := loadRow(ctx, tx, a.Workflow, a.ID, true)
		if err != nil {
			return err
		}
		i := stepIndex(r.Steps, a.Step)
		if r.State != StateRunning || r.CurrentStep == nil || *r.CurrentStep != a.Step || r.Steps[i].Attempts != a.Attempt {
			return nil
		}
		now := s.now()
		if r.Steps[i].StartedAt != nil {
			dur = now.Sub(*r.Steps[i].StartedAt)
		}
		finish(r.Steps, i, StateFailed, now, reason)
		r.State, _ = transition(r.State, "fail")
		if err := s.saveRow(ctx, tx, r, &reason, false); err != nil {
			return err
		}
		failed = true
		return s.changed(ctx, tx, "maas."+a.Workflow+".fail", "maas_"+a.Workflow, a.ID.String(), "maas."+a.Workflow+".failed",
			map[string]any{"step": a.Step, "reason": reason})
	})
	if err == nil && failed {
		s.Metrics.step(a.Workflow, a.Step, "failed", dur)
		s.Metrics.outcome(a.Workflow, StateFailed)
	}
	return err
}

// Retry restarts a failed workflow at the step that failed (or restartAt when given).
func (s *Service) retry(ctx context.Context, kind string, id uuid.UUID, restartAt func(failed string) string) error {
	return db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		r, err := loadRow(ctx, tx, kind, id, true)
		if errors.Is(err, pgx.ErrNoRows) {
			return wfNotFound(kind)
		}
		if err != nil {
			return err
		}
		to, ok := transition(r.State, "retry")
		if !ok || r.CurrentStep == nil {
			return apierr.New(apierr.InvalidRequest, "only a failed %s can be retried (it is %s)", kind, r.State).
				With("reason", kind+"_state_invalid").WithStatus(409)
		}
		step := *r.CurrentStep
		if restartAt != nil {
			step = restartAt(step)
		}
		now := s.now()
		j := stepIndex(r.Steps, step)
		for k := j + 1; k < len(r.Steps); k++ {
			if r.Steps[k].State == StateFailed {
				r.Steps[k].State = StatePending
			}
		}
		start(r.Steps, j, now, s.stepTimeout(step))
		r.State, r.CurrentStep = to, &step
		if err := s.saveRow(ctx, tx, r, nil, false); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `UPDATE `+table(kind)+` SET failure_reason = NULL WHERE id = $1`, id); err != nil {
			return err
		}
		if err := s.enqueue(ctx, tx, r); err != nil {
			return err
		}
		return s.changed(ctx, tx, "maas."+kind+".retry", "maas_"+kind, id.String(), "maas."+kind+".retried", map[string]any{"step": step})
	})
}

func wfNotFound(kind string) error {
	return apierr.New(apierr.InvalidRequest, "%s not found", kind).With("reason", "not_found").WithStatus(404)
}
