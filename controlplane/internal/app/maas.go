package app

import (
	"context"
	"fmt"
	"os"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/allocations"
	"github.com/gantry-gpu/gantry/controlplane/internal/catalog"
	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/maas"
	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/shared/apierr"
	"github.com/gantry-gpu/gantry/shared/clock"
)

// maas assembles the MAAS lifecycle and registers its workers and periodic sync.
func (a *App) maas(cat *catalog.Service) (*maas.Service, error) {
	mc := a.Config.Maas
	timeouts, err := mc.stepTimeouts()
	if err != nil {
		return nil, err
	}
	cfg := maas.Config{ControlPlaneURL: mc.ControlPlaneURL, LogGatewayURL: mc.LogGatewayURL, SyncInterval: mc.SyncInterval,
		PollInterval: mc.PollInterval, CallTimeout: mc.CallTimeout, StepTimeouts: timeouts,
		StepAttemptTimeout: mc.StepAttemptTimeout}
	if cfg.ControlPlaneURL == "" {
		cfg.ControlPlaneURL = "http://" + a.Config.HTTPAddr
	}
	if mc.ServerCAFile != "" {
		pem, err := os.ReadFile(mc.ServerCAFile)
		if err != nil {
			return nil, fmt.Errorf("GANTRY_MAAS_SERVER_CA_FILE: %w", err)
		}
		cfg.ServerCAPEM = string(pem)
	}
	svc := maas.New(a.Pool, a.Clock, a.IDs, a.Nodes, cat, a.Config.Auth.MasterKey.Derive("gantry/maas-secrets"), cfg, a.Log)
	svc.Jobs = a.Jobs
	svc.Allocations = maasAllocations{svc: a.Allocations, clock: a.Clock}
	if err := svc.Metrics.Register(a.Metrics.Registry); err != nil {
		return nil, fmt.Errorf("maas metrics: %w", err)
	}
	svc.Register(a.Jobs.Workers(), a.Jobs.AddPeriodic)
	return svc, nil
}

// maasAllocations is what decommissioning needs of the allocations feature.
type maasAllocations struct {
	svc   *allocations.Service
	clock clock.Clock
}

func (m maasAllocations) NodeInUse(ctx context.Context, nodeID uuid.UUID) (bool, error) {
	return m.svc.NodeInUse(ctx, nodeID)
}

// ForceReleaseNode force-releases the live allocations on the node (the decommission's
// drain deadline passed), as the system.
func (m maasAllocations) ForceReleaseNode(ctx context.Context, nodeID uuid.UUID) (int, error) {
	rows, err := m.svc.Pool.Query(ctx, `SELECT DISTINCT allocation_id FROM allocation_gpus WHERE node_id = $1 AND released_at IS NULL`, nodeID)
	if err != nil {
		return 0, err
	}
	var ids []uuid.UUID
	for rows.Next() {
		var id uuid.UUID
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return 0, err
		}
		ids = append(ids, id)
	}
	rows.Close()
	n := 0
	for _, id := range ids {
		if _, err := m.svc.ForceRelease(ctx, &principal.Principal{}, id); err != nil {
			// Ended meanwhile (released, failed): nothing to force.
			if ae, ok := apierr.As(err); ok && (ae.HTTPStatus() == 404 || ae.HTTPStatus() == 409) {
				continue
			}
			return n, err
		}
		n++
	}
	return n, nil
}

// LiveOnNode counts the node's allocations that hold GPUs and have not ended.
func (m maasAllocations) LiveOnNode(ctx context.Context, nodeID uuid.UUID) (int, error) {
	var n int
	err := db.Querier(ctx, m.svc.Pool).QueryRow(ctx, `SELECT count(DISTINCT a.id) FROM allocations a JOIN allocation_gpus g ON g.allocation_id = a.id
		WHERE g.node_id = $1 AND g.released_at IS NULL AND a.status NOT IN ('released', 'failed', 'completed')`, nodeID).Scan(&n)
	return n, err
}

// NodeWiped frees the GPUs ended allocations hold on a node whose machine MAAS released
// with disk erase: no workload survives that, so the cleanup confirmation is moot.
func (m maasAllocations) NodeWiped(ctx context.Context, nodeID uuid.UUID) error {
	_, err := db.Querier(ctx, m.svc.Pool).Exec(ctx, `UPDATE allocation_gpus g SET released_at = $2 FROM allocations a
		WHERE g.allocation_id = a.id AND g.node_id = $1 AND g.released_at IS NULL AND a.status IN ('released', 'failed', 'completed')`, nodeID, m.clock.Now().UTC())
	return err
}
