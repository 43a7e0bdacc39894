package maas

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/canonical/gomaasclient/client"
	"github.com/canonical/gomaasclient/entity"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/gantry-gpu/gantry/controlplane/internal/db"
)

// SyncResult is what one sync of a site changed.
type SyncResult struct {
	SiteID                                uuid.UUID
	MachineCount, Added, Updated, Removed int
	SyncedAt                              time.Time
}

// Machine is a synced machine with the SKUs it could make.
type Machine struct {
	SiteID                         uuid.UUID
	SystemID, Hostname, StatusName string
	Status                         int
	PowerState, Pool, Zone         string
	Tags                           []string
	CPUCount                       int
	MemoryMiB                      int64
	GPUs                           []GPUCount
	SKUCandidates                  []string
	OnboardingID, NodeID           *uuid.UUID
	SyncedAt                       time.Time
}

// SyncSite imports the site's machines (with GPUs from the commissioning inventory).
func (s *Service) SyncSite(ctx context.Context, siteID uuid.UUID) (SyncResult, error) {
	var machines []entity.Machine
	gpus := map[string][]GPUCount{}
	err := s.withClient(ctx, siteID, func(c *client.Client) error {
		var err error
		if machines, err = c.Machines.Get(&entity.MachinesParams{}); err != nil {
			return err
		}
		for _, m := range machines {
			devs, err := c.NodeDevices.Get(m.SystemID, &entity.NodeDeviceParams{HardwareType: "gpu"})
			if err != nil {
				return err
			}
			gpus[m.SystemID] = gpusFromDevices(devs)
		}
		return nil
	})
	if err != nil {
		return SyncResult{}, err
	}
	now := s.now()
	res := SyncResult{SiteID: siteID, MachineCount: len(machines), SyncedAt: now}
	err = db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		seen := make([]string, 0, len(machines))
		for _, m := range machines {
			seen = append(seen, m.SystemID)
			g, _ := json.Marshal(gpus[m.SystemID])
			var ip *string
			if len(m.IPAddresses) > 0 && m.IPAddresses[0] != nil {
				v := m.IPAddresses[0].String()
				ip = &v
			}
			tags := m.TagNames
			if tags == nil {
				tags = []string{}
			}
			var inserted bool
			err := tx.QueryRow(ctx, `INSERT INTO maas_machines (site_id, system_id, hostname, status, status_name, power_state, pool, zone,
				tags, cpu_count, memory_mib, gpus, ip_address, synced_at) VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13,$14)
				ON CONFLICT (site_id, system_id) DO UPDATE SET hostname = EXCLUDED.hostname, status = EXCLUDED.status,
				status_name = EXCLUDED.status_name, power_state = EXCLUDED.power_state, pool = EXCLUDED.pool, zone = EXCLUDED.zone,
				tags = EXCLUDED.tags, cpu_count = EXCLUDED.cpu_count, memory_mib = EXCLUDED.memory_mib, gpus = EXCLUDED.gpus,
				ip_address = EXCLUDED.ip_address, synced_at = EXCLUDED.synced_at
				RETURNING (xmax = 0)`, siteID, m.SystemID, m.Hostname, int(m.Status), m.StatusName, m.PowerState, m.Pool.Name, m.Zone.Name,
				tags, m.CPUCount, m.Memory, g, ip, now).Scan(&inserted)
			if err != nil {
				return fmt.Errorf("upsert maas machine: %w", err)
			}
			if inserted {
				res.Added++
			} else {
				res.Updated++
			}
		}
		tag, err := tx.Exec(ctx, `DELETE FROM maas_machines WHERE site_id = $1 AND NOT (system_id = ANY($2))`, siteID, seen)
		if err != nil {
			return err
		}
		res.Removed = int(tag.RowsAffected())
		if _, err := tx.Exec(ctx, `UPDATE maas_sites SET last_sync_at = $2 WHERE id = $1`, siteID, now); err != nil {
			return err
		}
		return s.changed(ctx, tx, "maas.site.sync", "maas_site", siteID.String(), "maas.site.synced",
			map[string]any{"machines": res.MachineCount, "added": res.Added, "removed": res.Removed})
	})
	return res, err
}

// ListMachines is a page of a site's synced machines by system id, with SKU candidates.
func (s *Service) ListMachines(ctx context.Context, siteID uuid.UUID, candidatesOnly bool, after string, limit int) ([]Machine, bool, error) {
	if _, err := s.GetSite(ctx, siteID); err != nil {
		return nil, false, err
	}
	skus, err := s.Catalog.ListSKUs(ctx, true, "", 200)
	if err != nil {
		return nil, false, err
	}
	rows, err := db.Querier(ctx, s.Pool).Query(ctx, `SELECT m.system_id, m.hostname, m.status, m.status_name, m.power_state, m.pool, m.zone,
		m.tags, m.cpu_count, m.memory_mib, m.gpus, m.synced_at,
		(SELECT o.id FROM maas_onboardings o WHERE o.site_id = m.site_id AND o.system_id = m.system_id ORDER BY o.created_at DESC LIMIT 1),
		(SELECT o.node_id FROM maas_onboardings o WHERE o.site_id = m.site_id AND o.system_id = m.system_id ORDER BY o.created_at DESC LIMIT 1)
		FROM maas_machines m WHERE m.site_id = $1 AND m.system_id > $2 ORDER BY m.system_id`, siteID, after)
	if err != nil {
		return nil, false, err
	}
	defer rows.Close()
	var out []Machine
	for rows.Next() {
		m := Machine{SiteID: siteID}
		var g []byte
		var onb, nodeID uuid.NullUUID
		if err := rows.Scan(&m.SystemID, &m.Hostname, &m.Status, &m.StatusName, &m.PowerState, &m.Pool, &m.Zone, &m.Tags, &m.CPUCount,
			&m.MemoryMiB, &g, &m.SyncedAt, &onb, &nodeID); err != nil {
			return nil, false, err
		}
		if err := json.Unmarshal(g, &m.GPUs); err != nil {
			return nil, false, err
		}
		if onb.Valid {
			m.OnboardingID = &onb.UUID
		}
		if nodeID.Valid {
			m.NodeID = &nodeID.UUID
		}
		m.SKUCandidates = []string{}
		for _, sku := range skus.Items {
			if makes(m.GPUs, sku.GpuModel, int(sku.GpuCount)) {
				m.SKUCandidates = append(m.SKUCandidates, sku.ID)
			}
		}
		if candidatesOnly && len(m.SKUCandidates) == 0 {
			continue
		}
		if m.Tags == nil {
			m.Tags = []string{}
		}
		out = append(out, m)
		if len(out) > limit {
			break
		}
	}
	more := len(out) > limit
	if more {
		out = out[:limit]
	}
	return out, more, rows.Err()
}

// SyncArgs is the periodic job that syncs every site.
type SyncArgs struct{}

// Kind implements river.JobArgs.
func (SyncArgs) Kind() string { return "maas_sync" }

// SyncWorker syncs every site (a failing site is logged; the others still sync).
type SyncWorker struct {
	river.WorkerDefaults[SyncArgs]
	Svc *Service
}

// Work implements river.Worker.
func (w *SyncWorker) Work(ctx context.Context, _ *river.Job[SyncArgs]) error {
	rows, err := w.Svc.Pool.Query(ctx, `SELECT id FROM maas_sites ORDER BY name`)
	if err != nil {
		return err
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil {
		return err
	}
	for _, id := range ids {
		if _, err := w.Svc.SyncSite(ctx, id); err != nil {
			w.Svc.Log.WarnContext(ctx, "scheduled maas sync failed", "site_id", id, "err", err)
		}
	}
	return w.Svc.observeStuck(ctx)
}

// observeStuck sets the age of the oldest running step per workflow and step (the
// alert GantryMaasOnboardingStuck fires on it).
func (s *Service) observeStuck(ctx context.Context) error {
	const started = `(SELECT (e->>'started_at')::timestamptz FROM jsonb_array_elements(steps) e WHERE e->>'name' = current_step)`
	rows, err := s.Pool.Query(ctx, `SELECT 'onboarding', current_step, min(`+started+`) FROM maas_onboardings WHERE state = 'running' GROUP BY current_step
		UNION ALL SELECT 'decommission', current_step, min(`+started+`) FROM maas_decommissions WHERE state = 'running' GROUP BY current_step`)
	if err != nil {
		return err
	}
	defer rows.Close()
	s.Metrics.StepAge.Reset()
	for rows.Next() {
		var wf, step string
		var since *time.Time
		if err := rows.Scan(&wf, &step, &since); err != nil {
			return err
		}
		if since != nil {
			s.Metrics.StepAge.WithLabelValues(wf, step).Set(s.now().Sub(*since).Seconds())
		}
	}
	return rows.Err()
}

// Register adds the lifecycle's workers and its periodic sync to a River runner.
func (s *Service) Register(workers *river.Workers, addPeriodic func(*river.PeriodicJob)) {
	river.AddWorker(workers, &StepWorker{Svc: s})
	river.AddWorker(workers, &SyncWorker{Svc: s})
	if addPeriodic != nil {
		addPeriodic(river.NewPeriodicJob(river.PeriodicInterval(s.Config.SyncInterval),
			func() (river.JobArgs, *river.InsertOpts) { return SyncArgs{}, nil }, &river.PeriodicJobOpts{RunOnStart: true}))
	}
}
