package nodes

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/gantry-gpu/gantry/controlplane/internal/audit"
	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/nodes/nodesdb"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// ScheduleState says whether placement may put new work on a node.
type ScheduleState string

const (
	// Schedulable: new allocations may be placed.
	Schedulable ScheduleState = "schedulable"
	// Cordoned: no new allocations; running ones stay.
	Cordoned ScheduleState = "cordoned"
	// Draining: no new allocations, and the running ones are being moved off / released.
	Draining ScheduleState = "draining"
	// Drained: draining finished; nothing runs on the node.
	Drained ScheduleState = "drained"
)

// ScheduleAction is an operator's (or the drain's) request to change the state.
type ScheduleAction string

const (
	ActionCordon   ScheduleAction = "cordon"
	ActionUncordon ScheduleAction = "uncordon"
	ActionDrain    ScheduleAction = "drain"
	// ActionDrainComplete is taken by the system when a draining node holds nothing.
	ActionDrainComplete ScheduleAction = "drain_complete"
)

// transitions is the one table of allowed moves. A move to the same state is allowed
// and changes nothing (no write, no audit); anything missing is refused.
var transitions = map[ScheduleAction]map[ScheduleState]ScheduleState{
	ActionCordon: {
		Schedulable: Cordoned,
		Cordoned:    Cordoned,
	},
	ActionUncordon: {
		Schedulable: Schedulable,
		Cordoned:    Schedulable,
		Draining:    Schedulable, // cancels the drain
		Drained:     Schedulable,
	},
	ActionDrain: {
		Schedulable: Draining,
		Cordoned:    Draining,
		Draining:    Draining,
		Drained:     Drained,
	},
	ActionDrainComplete: {
		Draining: Drained,
		Drained:  Drained,
	},
}

// ErrTransition is wrapped by refused schedule moves.
var ErrTransition = errors.New("nodes: schedule transition not allowed")

// Transition is the state action leads to from from, or an error wrapping ErrTransition.
func Transition(from ScheduleState, action ScheduleAction) (ScheduleState, error) {
	to, ok := transitions[action][from]
	if !ok {
		return from, apierr.New(apierr.InvalidRequest, "cannot %s a %s node", action, from).
			With("reason", "schedule_transition_invalid").With("from", string(from)).With("action", string(action)).
			WithStatus(409).Wrap(ErrTransition)
	}
	return to, nil
}

// ChangeSchedule applies an operator action (cordon, uncordon, drain) to the node. A
// drain of a node that live allocations do not use completes at once (drained).
func (s *Service) ChangeSchedule(ctx context.Context, nodeID uuid.UUID, action ScheduleAction) (Node, error) {
	if action == ActionDrainComplete {
		return Node{}, fmt.Errorf("nodes: %s is not an operator action", action)
	}
	var out nodesdb.Node
	err := db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		q := nodesdb.New(tx)
		n, err := lockNode(ctx, q, nodeID)
		if err != nil {
			return err
		}
		from := ScheduleState(n.ScheduleState)
		to, err := Transition(from, action)
		if err != nil {
			return err
		}
		if to == Draining {
			inUse, err := s.Allocations.NodeInUse(ctx, nodeID)
			if err != nil {
				return fmt.Errorf("node in use: %w", err)
			}
			if !inUse {
				to, _ = Transition(to, ActionDrainComplete)
			}
		}
		out, err = s.applySchedule(ctx, tx, n, to, string(action))
		return err
	})
	if err != nil {
		return Node{}, err
	}
	return s.view(ctx, out)
}

// SettleDrain completes the drain of a node that no live allocation uses any more (the
// allocations feature calls it when it releases the last one). It does nothing for a
// node that is not draining or still in use.
func (s *Service) SettleDrain(ctx context.Context, nodeID uuid.UUID) error {
	return db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		q := nodesdb.New(tx)
		n, err := lockNode(ctx, q, nodeID)
		if err != nil || ScheduleState(n.ScheduleState) != Draining {
			return err
		}
		inUse, err := s.Allocations.NodeInUse(ctx, nodeID)
		if err != nil || inUse {
			return err
		}
		_, err = s.applySchedule(ctx, tx, n, Drained, string(ActionDrainComplete))
		return err
	})
}

func (s *Service) applySchedule(ctx context.Context, tx pgx.Tx, n nodesdb.Node, to ScheduleState, action string) (nodesdb.Node, error) {
	from := ScheduleState(n.ScheduleState)
	if from == to {
		return n, nil
	}
	out, err := nodesdb.New(tx).SetScheduleState(ctx, nodesdb.SetScheduleStateParams{ID: n.ID, ScheduleState: string(to), UpdatedAt: s.now()})
	if err != nil {
		return n, fmt.Errorf("set schedule state: %w", err)
	}
	if err := s.Audit.Record(ctx, tx, audit.Entry{
		Action: "node." + action, TargetType: "node", TargetID: n.ID.String(),
		Metadata: map[string]any{"from": string(from), "to": string(to)},
	}); err != nil {
		return n, err
	}
	return out, s.event(ctx, tx, "node.schedule_changed", n.ID, map[string]any{"from": string(from), "to": string(to)})
}
