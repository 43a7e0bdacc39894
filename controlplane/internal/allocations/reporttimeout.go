package allocations

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/gantry-gpu/gantry/controlplane/internal/allocations/allocationsdb"
	"github.com/gantry-gpu/gantry/controlplane/internal/allocations/lifecycle"
	"github.com/gantry-gpu/gantry/controlplane/internal/loop"
)

// Defaults of the report timeout (Config).
const (
	DefaultReportTimeout       = 30 * time.Minute
	DefaultReportCheckInterval = time.Minute
	// reportSweepBatch bounds the tasks one sweep reads; a longer backlog is taken by
	// the next sweeps.
	reportSweepBatch = 500
)

// ReasonReportTimeout is the reason code of a task the agent acknowledged and never
// reported on.
const ReasonReportTimeout = "report_timeout"

// ReportTimeoutStats says what one sweep did.
type ReportTimeoutStats struct {
	Failed   int // tasks failed with their allocation moved (failed, release_failed, restart_failed)
	Finished int // tasks only closed: a stop, or an allocation that had moved on
}

// ExpireUnreported ends the tasks whose agent acknowledged them more than
// Config.ReportTimeout ago and never reported a result: the agent died or lost the task
// after taking it, and without this an allocation would wait in provisioning (or
// releasing, restarting) forever. Per kind, as if the agent had reported a failure with
// "report_timeout: ...": provision → failed (billing never started,
// provisioning.failed) with the node flagged for cleanup, since the agent may have
// created the workload before it went silent: its GPUs stay held, out of placement,
// until the node confirms the workload gone (cleanup.go); release → release_failed
// (retry allowed; provisioning.release_failed); restart → restart_failed. A stop task, and a task whose
// allocation has moved on (released meanwhile, say), is only closed. A report that
// arrives later finds the task finished and changes nothing. Safe on every replica at
// once: each task is decided under its allocation's lock.
func (s *Service) ExpireUnreported(ctx context.Context) (ReportTimeoutStats, error) {
	var st ReportTimeoutStats
	ids, err := s.read(ctx).UnreportedTasks(ctx, allocationsdb.UnreportedTasksParams{
		AckedBefore: ptr(s.now().Add(-s.Config.ReportTimeout)), MaxTasks: reportSweepBatch,
	})
	if err != nil {
		return st, fmt.Errorf("unreported tasks: %w", err)
	}
	reason := func(kind string) string {
		return fmt.Sprintf("%s: node acknowledged the %s task but did not report within %s", ReasonReportTimeout, kind, humanDuration(s.Config.ReportTimeout))
	}
	for _, id := range ids {
		_, err := s.onTask(ctx, id, func(tx pgx.Tx, a Allocation, t allocationsdb.GetTaskForDispatchRow) (lifecycle.Outcome, error) {
			// Read again under the lock: reported (or overtaken) since the sweep's read.
			if t.FinishedAt != nil || t.AckedAt == nil || !t.AckedAt.Before(s.now().Add(-s.Config.ReportTimeout)) {
				return lifecycle.Outcome{}, nil
			}
			ev, _ := failureOf(t.Kind)
			move := ev != "" && !t.Superseded && moves(lifecycle.Status(a.Status), ev)
			// A provision the agent took may have created the workload before it went
			// silent: the GPUs stay held until the node confirms it gone (cleanup.go).
			cleanup := t.Kind == TaskProvision
			out, err := s.failTask(ctx, tx, a, t, int(t.Attempts), ReasonReportTimeout, reason(t.Kind), move, cleanup)
			if err != nil {
				return out, err
			}
			if !out.Changed {
				st.Finished++
				return out, nil
			}
			st.Failed++
			s.Log.WarnContext(ctx, "allocation task acknowledged but never reported: failed",
				"task_id", t.TaskID, "task_kind", t.Kind, "allocation_id", a.ID, "node_id", a.NodeID, "status", string(out.To))
			return out, nil
		})
		if err != nil && !errors.Is(err, ErrUnknownTask) {
			return st, err
		}
	}
	return st, nil
}

// moves reports whether ev changes an allocation in status from.
func moves(from lifecycle.Status, ev lifecycle.Event) bool {
	out, err := lifecycle.Apply(from, ev)
	return err == nil && out.Changed
}

// RunReportTimeouts runs ExpireUnreported every interval until ctx ends (interval <= 0:
// never).
func (s *Service) RunReportTimeouts(ctx context.Context, interval time.Duration) {
	loop.Every(ctx, interval, s.Log, "report timeout sweep", func(ctx context.Context) error {
		_, err := s.ExpireUnreported(ctx)
		return err
	})
}
