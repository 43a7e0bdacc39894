package maas

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/canonical/gomaasclient/client"
	"github.com/canonical/gomaasclient/entity"
	"github.com/canonical/gomaasclient/entity/node"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/nodes"
	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// DecommissionSpec is a decommission to start.
type DecommissionSpec struct {
	NodeID        uuid.UUID
	DrainDeadline *time.Time
	Erase         string // quick (default) or secure
	Reason        *string
}

// Decommission is a decommission as stored.
type Decommission struct {
	ID            uuid.UUID
	NodeID        uuid.UUID
	NodeName      string
	SiteID        *uuid.UUID
	SystemID      *string
	DrainDeadline *time.Time
	Erase         string
	Reason        *string
	State         string
	CurrentStep   *string
	FailureReason *string
	Steps         []Step
	CreatedAt     time.Time
	UpdatedAt     time.Time
	FinishedAt    *time.Time
}

const decomCols = `id, node_id, node_name, site_id, system_id, drain_deadline, erase, reason, state, current_step, failure_reason,
	steps, created_at, updated_at, finished_at`

// GetDecommission is one decommission.
func (s *Service) GetDecommission(ctx context.Context, id uuid.UUID) (Decommission, error) {
	var d Decommission
	var site uuid.NullUUID
	var steps []byte
	err := db.Querier(ctx, s.Pool).QueryRow(ctx, `SELECT `+decomCols+` FROM maas_decommissions WHERE id = $1`, id).Scan(
		&d.ID, &d.NodeID, &d.NodeName, &site, &d.SystemID, &d.DrainDeadline, &d.Erase, &d.Reason, &d.State, &d.CurrentStep,
		&d.FailureReason, &steps, &d.CreatedAt, &d.UpdatedAt, &d.FinishedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return d, wfNotFound(KindDecommission)
	}
	if err != nil {
		return d, fmt.Errorf("get decommission: %w", err)
	}
	if site.Valid {
		d.SiteID = &site.UUID
	}
	return d, json.Unmarshal(steps, &d.Steps)
}

// CreateDecommission starts the decommission of a node.
func (s *Service) CreateDecommission(ctx context.Context, spec DecommissionSpec) (Decommission, error) {
	if spec.Erase == "" {
		spec.Erase = "quick"
	}
	if spec.Erase != "quick" && spec.Erase != "secure" {
		return Decommission{}, apierr.Validation("erase", "erase must be quick or secure")
	}
	n, err := s.Nodes.Get(ctx, spec.NodeID)
	if err != nil {
		return Decommission{}, err
	}
	if spec.DrainDeadline == nil && s.Allocations != nil {
		inUse, err := s.Allocations.NodeInUse(ctx, spec.NodeID)
		if err != nil {
			return Decommission{}, err
		}
		if inUse {
			return Decommission{}, apierr.New(apierr.NodeInUse, "allocations are running on this node; give a drain_deadline after which they are force-released").
				With("reason", "allocations_running")
		}
	}
	// The machine behind the node, when it came through MAAS.
	var siteID *uuid.UUID
	var systemID *string
	var sid uuid.UUID
	var sys string
	err = db.Querier(ctx, s.Pool).QueryRow(ctx, `SELECT site_id, system_id FROM maas_onboardings WHERE node_id = $1 AND state = 'succeeded'
		ORDER BY created_at DESC LIMIT 1`, spec.NodeID).Scan(&sid, &sys)
	if err == nil {
		siteID, systemID = &sid, &sys
	} else if !errors.Is(err, pgx.ErrNoRows) {
		return Decommission{}, err
	}
	now := s.now()
	id := s.IDs.New()
	steps := newSteps(DecommissionSteps)
	start(steps, 0, now, s.stepTimeout(StepCordon))
	first := StepCordon
	raw, _ := json.Marshal(steps)
	var createdBy *uuid.UUID
	if p, ok := principal.From(ctx); ok && p.UserID != uuid.Nil {
		createdBy = &p.UserID
	}
	err = db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO maas_decommissions (id, node_id, node_name, site_id, system_id, drain_deadline, erase, reason,
			state, current_step, steps, created_by, created_at, updated_at) VALUES ($1,$2,$3,$4,$5,$6,$7,$8,'running',$9,$10,$11,$12,$12)`,
			id, n.ID, n.Name, siteID, systemID, spec.DrainDeadline, spec.Erase, spec.Reason, first, raw, createdBy, now)
		if isUnique(err) {
			return apierr.New(apierr.InvalidRequest, "the node is already being decommissioned").With("reason", "decommission_in_progress").WithStatus(409)
		}
		if err != nil {
			return fmt.Errorf("insert decommission: %w", err)
		}
		if err := s.enqueue(ctx, tx, wfRow{Kind: KindDecommission, ID: id, State: StateRunning, CurrentStep: &first, Steps: steps}); err != nil {
			return err
		}
		return s.changed(ctx, tx, "maas.decommission.create", "maas_decommission", id.String(), "maas.decommission.started",
			map[string]any{"node_id": n.ID.String(), "erase": spec.Erase})
	})
	if err != nil {
		return Decommission{}, err
	}
	s.Metrics.started(KindDecommission)
	return s.GetDecommission(ctx, id)
}

func ignoreTransition(err error) error {
	if errors.Is(err, nodes.ErrTransition) {
		return nil
	}
	return err
}

func (s *Service) decommissionStep(ctx context.Context, id uuid.UUID, step string) (Outcome, error) {
	d, err := s.GetDecommission(ctx, id)
	if err != nil {
		return Outcome{}, err
	}
	switch step {
	case StepCordon:
		return Outcome{Done: true, Apply: func(ctx context.Context, _ pgx.Tx) error {
			_, err := s.Nodes.ChangeSchedule(ctx, d.NodeID, nodes.ActionCordon)
			return ignoreTransition(err)
		}}, nil
	case StepDrain:
		n, err := s.Nodes.Get(ctx, d.NodeID)
		if err != nil {
			return Outcome{}, err
		}
		switch nodes.ScheduleState(n.ScheduleState) {
		case nodes.Drained:
			return done(), nil
		case nodes.Cordoned, nodes.Schedulable:
			if _, err := s.Nodes.ChangeSchedule(ctx, d.NodeID, nodes.ActionDrain); err != nil {
				return Outcome{}, err
			}
			return waiting("draining: waiting for allocations to end"), nil
		}
		if d.DrainDeadline != nil && !s.now().Before(*d.DrainDeadline) && s.Allocations != nil {
			k, err := s.Allocations.ForceReleaseNode(ctx, d.NodeID)
			if err != nil {
				return Outcome{}, err
			}
			live, err := s.Allocations.LiveOnNode(ctx, d.NodeID)
			if err != nil {
				return Outcome{}, err
			}
			if live == 0 {
				// Force-released allocations keep their GPUs until the node confirms the
				// workload gone; the machine's erase is that confirmation (retire step).
				return Outcome{Done: true, Reason: fmt.Sprintf("drain deadline passed: force-released %d allocation(s)", k)}, nil
			}
			return waiting(fmt.Sprintf("drain deadline passed: force-releasing %d allocation(s)", live)), nil
		}
		if err := s.Nodes.SettleDrain(ctx, d.NodeID); err != nil {
			return Outcome{}, err
		}
		return waiting("draining: waiting for allocations to end"), nil
	case StepRevokeToken:
		if _, err := s.Nodes.RevokeToken(ctx, d.NodeID); err != nil {
			return Outcome{}, err
		}
		return done(), nil
	case StepRelease:
		if d.SiteID == nil || d.SystemID == nil {
			return skip("the node was not onboarded through MAAS"), nil
		}
		var out Outcome
		err := s.withClient(ctx, *d.SiteID, func(c *client.Client) error {
			m, err := c.Machine.Get(*d.SystemID)
			if err != nil {
				if Classify(err) == FailNotFound {
					out = skip("MAAS no longer knows the machine")
					return nil
				}
				return err
			}
			switch m.Status {
			case node.StatusReady, node.StatusNew:
				out = done()
			case node.StatusReleasing, node.StatusDiskErasing:
				out = waiting("MAAS is releasing and erasing the machine")
			case node.StatusFailedReleasing, node.StatusFailedDiskErasing:
				if d.Steps[stepIndex(d.Steps, StepRelease)].Reason != nil {
					// This attempt released the machine and MAAS says it failed.
					out = fail(machineFailed(m))
					return nil
				}
				// A fresh attempt (a re-run after an earlier decommission failed here):
				// MAAS releases a machine from these states again, erasing it anew.
				fallthrough
			case node.StatusDeployed, node.StatusAllocated, node.StatusDeploying, node.StatusFailedDeployment, node.StatusReserved:
				p := &entity.MachineReleaseParams{Comment: "gantry decommission " + d.ID.String(), Erase: true, QuickErase: d.Erase == "quick",
					SecureErase: d.Erase == "secure"}
				if _, err := c.Machine.Release(*d.SystemID, p); err != nil {
					return err
				}
				out = waiting("MAAS is releasing and erasing the machine")
			default:
				if r := machineFailed(m); r != "" {
					out = fail(r)
				} else {
					out = fail(fmt.Sprintf("machine is %s in MAAS; it cannot be released", m.StatusName))
				}
			}
			return nil
		})
		return out, err
	case StepRetire:
		erased := d.Steps[stepIndex(d.Steps, StepRelease)].State == StateSucceeded
		return Outcome{Done: true, Apply: func(ctx context.Context, _ pgx.Tx) error {
			if erased && s.Allocations != nil {
				if err := s.Allocations.NodeWiped(ctx, d.NodeID); err != nil {
					return err
				}
			}
			err := s.Nodes.Delete(ctx, d.NodeID)
			if apierr.CodeOf(err) == apierr.NodeNotFound {
				return nil
			}
			return err
		}}, nil
	}
	return Outcome{}, fmt.Errorf("maas: unknown decommission step %q", step)
}
