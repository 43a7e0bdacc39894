package allocations

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/gantry-gpu/gantry/controlplane/internal/allocations/allocationsdb"
	"github.com/gantry-gpu/gantry/controlplane/internal/allocations/lifecycle"
	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/loop"
)

// Defaults of idle detection (Config).
const (
	DefaultIdleUtilizationPercent = 5
	DefaultIdleAfter              = 30 * time.Minute
	DefaultIdleSampleMaxAge       = 5 * time.Minute
	DefaultIdleCheckInterval      = time.Minute
)

// IdleStats says what one idle evaluation did.
type IdleStats struct {
	Evaluated  int // active and idle allocations looked at
	Unknown    int // some GPU without a fresh sample: no decision
	Marked     int // started the under-threshold clock
	Cleared    int // stopped it (utilization back up, or no evidence)
	WentIdle   int // active -> idle
	BecameBusy int // idle -> active
}

type idleGPU struct {
	node uuid.UUID
	gpu  string
}

type idleCandidate struct {
	id     uuid.UUID
	status lifecycle.Status
	since  *time.Time
	gpus   []idleGPU
}

// EvaluateIdle runs one pass of idle detection over every active and idle allocation,
// against the latest GPU samples of the fleet view (nodes.Service.Fleet):
//
//   - every GPU of the allocation under Config.IdleUtilizationPercent: an active
//     allocation starts the under-threshold clock (under_threshold_since, set by
//     compare-and-set, so the first replica to see it wins and a restart keeps it), and
//     once the clock is Config.IdleAfter old it goes idle (went_idle);
//   - any GPU at or over the threshold: an active allocation's clock is cleared, an
//     idle one goes back to active (became_busy);
//   - any GPU without a sample, or with one older than Config.IdleSampleMaxAge (the
//     node stopped reporting): no evidence either way; an active allocation's clock is
//     cleared (idle needs an unbroken run of fresh low samples) and an idle one stays.
//
// Every status change resets the clock (SetStatus), so a restarted workload is observed
// afresh. Moves go through the lifecycle with actor system; each pass is safe on every
// replica at once (a second went_idle is a repeat and writes nothing).
func (s *Service) EvaluateIdle(ctx context.Context) (IdleStats, error) {
	var st IdleStats
	rows, err := s.read(ctx).RunningGPUs(ctx)
	if err != nil {
		return st, fmt.Errorf("running gpus: %w", err)
	}
	if len(rows) == 0 {
		return st, nil
	}
	var cands []*idleCandidate
	for _, r := range rows {
		if n := len(cands); n == 0 || cands[n-1].id != r.ID {
			cands = append(cands, &idleCandidate{id: r.ID, status: lifecycle.Status(r.Status), since: r.UnderThresholdSince})
		}
		c := cands[len(cands)-1]
		c.gpus = append(c.gpus, idleGPU{node: r.NodeID, gpu: r.GpuUuid})
	}
	view, err := s.Fleet.Fleet(ctx, uuid.Nil, math.MaxInt32)
	if err != nil {
		return st, fmt.Errorf("fleet: %w", err)
	}
	type sample struct {
		util int32
		at   time.Time
	}
	samples := map[idleGPU]sample{}
	for _, n := range view.Nodes {
		for _, g := range n.GPUs {
			if g.UtilizationPercent.Valid && g.SampledAt != nil {
				samples[idleGPU{node: n.ID, gpu: g.GpuUuid}] = sample{util: g.UtilizationPercent.Int32, at: *g.SampledAt}
			}
		}
	}
	now := s.now()
	threshold := int32(s.Config.IdleUtilizationPercent)
	var errs []error
	for _, c := range cands {
		st.Evaluated++
		known, under := true, true
		for _, g := range c.gpus {
			smp, ok := samples[g]
			if !ok || now.Sub(smp.at) > s.Config.IdleSampleMaxAge {
				known = false
				break
			}
			if smp.util >= threshold {
				under = false
			}
		}
		var err error
		switch {
		case !known:
			st.Unknown++
			if c.status == lifecycle.Active && c.since != nil {
				err = s.clearUnder(ctx, c.id, &st)
			}
		case under && c.status == lifecycle.Active && c.since == nil:
			var n int64
			if n, err = s.read(ctx).MarkUnderThreshold(ctx, allocationsdb.MarkUnderThresholdParams{ID: c.id, UnderThresholdSince: &now}); n > 0 {
				st.Marked++
			}
		case under && c.status == lifecycle.Active && now.Sub(*c.since) >= s.Config.IdleAfter:
			var moved bool
			if moved, err = s.goIdle(ctx, c.id, now); moved {
				st.WentIdle++
			}
		case !under && c.status == lifecycle.Active && c.since != nil:
			err = s.clearUnder(ctx, c.id, &st)
		case !under && c.status == lifecycle.Idle:
			var out lifecycle.Outcome
			_, out, err = s.applyWith(ctx, c.id, nil, lifecycle.BecameBusy, Actor{Type: ActorSystem},
				fmt.Sprintf("gpu utilization at or over %d%%", threshold), nil)
			if errors.Is(err, lifecycle.ErrForbidden) {
				err = nil // it moved meanwhile (released, stopped, ...)
			}
			if out.Changed {
				st.BecameBusy++
			}
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("allocation %s: %w", c.id, err))
		}
	}
	return st, errors.Join(errs...)
}

func (s *Service) clearUnder(ctx context.Context, id uuid.UUID, st *IdleStats) error {
	n, err := s.read(ctx).ClearUnderThreshold(ctx, id)
	if n > 0 {
		st.Cleared++
	}
	return err
}

// goIdle moves an active allocation to idle if, on its locked row, the clock still says
// so: another replica may have cleared it since this pass read it.
func (s *Service) goIdle(ctx context.Context, id uuid.UUID, now time.Time) (bool, error) {
	moved := false
	err := db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		a, err := allocationsdb.New(tx).LockAllocation(ctx, id)
		if err != nil {
			return fmt.Errorf("lock allocation: %w", err)
		}
		since := a.UnderThresholdSince
		if lifecycle.Status(a.Status) != lifecycle.Active || since == nil || now.Sub(*since) < s.Config.IdleAfter {
			return nil
		}
		reason := fmt.Sprintf("gpu utilization under %d%% since %s", s.Config.IdleUtilizationPercent, since.UTC().Format(time.RFC3339))
		_, out, err := s.transition(ctx, tx, a, lifecycle.WentIdle, Actor{Type: ActorSystem}, reason)
		moved = out.Changed
		return err
	})
	return moved, err
}

// RunIdleDetection runs EvaluateIdle every interval until ctx ends (interval <= 0: never).
func (s *Service) RunIdleDetection(ctx context.Context, interval time.Duration) {
	loop.Every(ctx, interval, s.Log, "idle detection", func(ctx context.Context) error {
		_, err := s.EvaluateIdle(ctx)
		return err
	})
}
