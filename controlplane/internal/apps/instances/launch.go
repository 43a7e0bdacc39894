package instances

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/gantry-gpu/gantry/controlplane/internal/allocations"
	"github.com/gantry-gpu/gantry/controlplane/internal/apps/instances/lifecycle"
	"github.com/gantry-gpu/gantry/controlplane/internal/audit"
	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/controlplane/internal/projectctx"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// LaunchSpec is what POST /api/v1/app-instances asks for: exactly one of AllocationID
// (an existing live allocation of the project) and SKU (a new allocation for it).
type LaunchSpec struct {
	Name         string
	AppSlug      string
	Version      string
	AllocationID uuid.NullUUID
	SKU          string
	// Region, KeyIDs, OSImageID: for a new allocation, as in POST /api/v1/allocations.
	Region    string
	KeyIDs    []uuid.UUID
	OSImageID uuid.NullUUID
	// ArtifactIDs are artifacts of the project to mount read-only (at most 16).
	ArtifactIDs []uuid.UUID
}

// Limits of the request fields (seed §8; the contract says the same).
const (
	maxNameLen    = 120
	maxVersionLen = 64
	maxArtifacts  = 16
)

var slugPattern = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{1,62}$`)

// Allocation statuses an instance may be launched onto or started on: the workload runs.
func allocationRuns(status string) bool { return status == "active" || status == "idle" }

// allocationPending: the allocation is on its way to active; the instance waits.
func allocationPending(status string) bool { return status == "requested" || status == "provisioning" }

// allocationEnded: the allocation no longer runs workloads (seed §3 statuses); its
// instances stop. restarting is neither: the agent restarts the workload, the
// instance's own reports say the rest.
func allocationEnded(status string) bool {
	switch status {
	case "stopped", "releasing", "released", "release_failed", "failed", "completed", "restart_failed":
		return true
	}
	return false
}

// Launch creates an instance. The checks run in the order docs/apps.md numbers them,
// each with its contract code, and every write (a new allocation included) happens in
// one transaction after the checks that need no lock: a refusal leaves no row, no task
// and no audit entry.
func (s *Service) Launch(ctx context.Context, p *principal.Principal, proj projectctx.Project, spec LaunchSpec) (Instance, error) {
	// 1. The body: name, app slug, version, and exactly one of allocation_id and sku.
	name := strings.TrimSpace(spec.Name)
	if name == "" || len([]rune(spec.Name)) > maxNameLen {
		return Instance{}, apierr.Validation("name", "name must be 1..%d characters and not blank", maxNameLen).With("reason", "length")
	}
	if !slugPattern.MatchString(spec.AppSlug) {
		return Instance{}, apierr.Validation("app_slug", "app_slug must match ^[a-z0-9][a-z0-9-]{1,62}$").With("reason", "pattern")
	}
	if n := len([]rune(spec.Version)); n < 1 || n > maxVersionLen {
		return Instance{}, apierr.Validation("version", "version must be 1..%d characters", maxVersionLen).With("reason", "length")
	}
	if spec.AllocationID.Valid == (spec.SKU != "") {
		return Instance{}, apierr.Validation("allocation_id", "name exactly one of allocation_id and sku").With("reason", "one_of")
	}
	if len(spec.ArtifactIDs) > maxArtifacts {
		return Instance{}, apierr.Validation("artifact_ids", "at most %d artifacts", maxArtifacts).With("reason", "too_many")
	}
	// 2. The caller may launch here: viewers may not.
	if !proj.AtLeast(projectctx.RoleMember) {
		return Instance{}, apierr.New(apierr.InsufficientPermissions, "viewers cannot launch app instances in this project").
			With("required_role", projectctx.RoleMember)
	}
	// 3. The app version exists, is not deprecated, and the tenant is entitled to it.
	v, err := s.Catalog.LaunchVersion(ctx, proj.TenantID, spec.AppSlug, spec.Version)
	if err != nil {
		return Instance{}, err
	}
	// 4. An existing allocation: the project's, running, with the GPUs the version needs.
	var existing allocations.Allocation
	if spec.AllocationID.Valid {
		if existing, err = s.Allocations.Get(ctx, proj.ID, spec.AllocationID.UUID); err != nil {
			return Instance{}, err
		}
		if !allocationRuns(existing.Status) {
			return Instance{}, apierr.New(apierr.AllocationNotActive, "the allocation is %s: an app starts on an active allocation", existing.Status).
				With("reason", "status_not_eligible").With("status", existing.Status)
		}
		if err := fits(v, existing); err != nil {
			return Instance{}, err
		}
	}
	// 5. The artifacts are the project's.
	if len(spec.ArtifactIDs) > 0 {
		if s.Artifacts == nil {
			return Instance{}, apierr.Validation("artifact_ids", "artifacts are not available").With("reason", "artifact_not_found")
		}
		if err := s.Artifacts.CheckProjectArtifacts(ctx, proj.ID, spec.ArtifactIDs); err != nil {
			return Instance{}, err
		}
	}
	spec.Name = name
	var inst Instance
	err = s.within(ctx, func(tx pgx.Tx) error {
		// 6. The project's instance quota, under the project's lock.
		if err := s.lockProject(ctx, tx, proj.ID); err != nil {
			return err
		}
		// 7. A new allocation, with every check of an allocation launch, in this
		// transaction (allocations joins the ambient one).
		a := existing
		created := false
		if !spec.AllocationID.Valid {
			if a, err = s.Allocations.Create(db.WithTx(ctx, tx), p, proj, allocations.CreateSpec{
				Name: truncate(name, maxNameLen), SKU: spec.SKU, Region: spec.Region, KeyIDs: spec.KeyIDs, OSImageID: spec.OSImageID,
			}); err != nil {
				return err
			}
			if err := fits(v, a); err != nil {
				return err
			}
			created = true
		}
		// 8. The allocation's other instances: a whole-allocation version is alone on it.
		if err := s.checkNeighbours(ctx, tx, v, a.ID); err != nil {
			return err
		}
		// 9. A port on the node.
		port, err := s.port(ctx, tx, v, a.NodeID)
		if err != nil {
			return err
		}
		inst, err = s.insert(ctx, tx, p, proj, spec, v, a, created, port)
		return err
	})
	return inst, err
}

// fits checks the allocation against the version's GPU needs.
func fits(v Version, a allocations.Allocation) error {
	if int(a.GpuCount) < v.MinGPUs {
		return apierr.Validation("allocation_id", "%s %s needs at least %d GPUs; the allocation has %d", v.AppSlug, v.Version, v.MinGPUs, a.GpuCount).
			With("reason", "insufficient_gpus").With("min_gpus", v.MinGPUs).With("gpu_count", a.GpuCount)
	}
	if v.GPUModel != "" && !strings.EqualFold(v.GPUModel, a.GpuModel) {
		return apierr.Validation("allocation_id", "%s %s needs %s GPUs; the allocation has %s", v.AppSlug, v.Version, v.GPUModel, a.GpuModel).
			With("reason", "gpu_model_mismatch").With("gpu_model", v.GPUModel)
	}
	return nil
}

// lockProject takes the project's instance lock and counts its live instances.
func (s *Service) lockProject(ctx context.Context, tx pgx.Tx, projectID uuid.UUID) error {
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('app_instances:project:' || $1::text, 0))`, projectID); err != nil {
		return fmt.Errorf("lock project instances: %w", err)
	}
	var live int
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM app_instances WHERE project_id = $1 AND state NOT IN ('stopped', 'failed')`,
		projectID).Scan(&live); err != nil {
		return fmt.Errorf("count live instances: %w", err)
	}
	if live >= s.Config.MaxPerProject {
		return apierr.New(apierr.AppInstanceQuotaExceeded, "the project already has %d live app instances", live).
			With("limit", s.Config.MaxPerProject)
	}
	return nil
}

func (s *Service) checkNeighbours(ctx context.Context, tx pgx.Tx, v Version, allocationID uuid.UUID) error {
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('app_instances:allocation:' || $1::text, 0))`, allocationID); err != nil {
		return fmt.Errorf("lock allocation instances: %w", err)
	}
	var live int
	var whole bool
	if err := tx.QueryRow(ctx, `SELECT count(*), coalesce(bool_or((run_spec->>'whole_allocation')::boolean), false)
		FROM app_instances WHERE allocation_id = $1 AND state NOT IN ('stopped', 'failed')`, allocationID).Scan(&live, &whole); err != nil {
		return fmt.Errorf("count allocation instances: %w", err)
	}
	if whole || (v.WholeAllocation && live > 0) {
		return apierr.New(apierr.AppInstanceStateInvalid, "the allocation already runs an app instance that needs it whole, or this one needs it whole").
			With("reason", "allocation_in_use").With("live_instances", live)
	}
	return nil
}

// port is the port the instance serves on its node, chosen under the node's lock (the
// unique index app_instances_node_port_key backs it): the version's own port when it is
// free there; when it is taken and the version's command or environment takes the
// port from {port}, the lowest free port of the node's range; a version that hard-codes
// its port cannot run twice on one node (app_instance_state_invalid, port_in_use).
func (s *Service) port(ctx context.Context, tx pgx.Tx, v Version, nodeID uuid.UUID) (int, error) {
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('app_instances:node:' || $1::text, 0))`, nodeID); err != nil {
		return 0, fmt.Errorf("lock node ports: %w", err)
	}
	rows, err := tx.Query(ctx, `SELECT port FROM app_instances WHERE node_id = $1 AND state NOT IN ('stopped', 'failed')`, nodeID)
	if err != nil {
		return 0, fmt.Errorf("node ports: %w", err)
	}
	used, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		return 0, fmt.Errorf("node ports: %w", err)
	}
	taken := make(map[int]bool, len(used))
	for _, p := range used {
		taken[p] = true
	}
	if v.Port > 0 && !taken[v.Port] {
		return v.Port, nil
	}
	if v.Port > 0 && !templatesPort(v) {
		return 0, apierr.New(apierr.AppInstanceStateInvalid, "port %d is already served by another app instance on this node", v.Port).
			With("reason", "port_in_use").With("port", v.Port)
	}
	for p := s.Config.PortBase; p < s.Config.PortBase+s.Config.PortCount; p++ {
		if !taken[p] {
			return p, nil
		}
	}
	return 0, apierr.New(apierr.ServiceUnavailable, "no free app port on the node").With("reason", "ports_exhausted")
}

// templatesPort reports whether the version takes its port from {port}.
func templatesPort(v Version) bool {
	for _, a := range v.Command {
		if strings.Contains(a, "{port}") {
			return true
		}
	}
	for _, e := range v.Env {
		if strings.Contains(e, "{port}") {
			return true
		}
	}
	return false
}

// insert stores the new instance as requested with its audit row and event; on a
// running allocation its app.start task is enqueued at once (the reconcile pass delivers
// it), else the pass enqueues it when the allocation becomes active.
func (s *Service) insert(ctx context.Context, tx pgx.Tx, p *principal.Principal, proj projectctx.Project, spec LaunchSpec, v Version,
	a allocations.Allocation, created bool, port int) (Instance, error) {
	rs := RunSpec{Kind: v.Kind, Command: v.Command, Env: v.Env, Port: port, Health: v.Health, MinGPUs: v.MinGPUs,
		GPUModel: v.GPUModel, WholeAllocation: v.WholeAllocation, BootstrapSSH: v.BootstrapSSH}
	if rs.Env == nil {
		rs.Env = map[string]string{}
	}
	body, err := json.Marshal(rs)
	if err != nil {
		return Instance{}, fmt.Errorf("run spec: %w", err)
	}
	now := s.now()
	i := Instance{
		ID: s.IDs.New(), TenantID: proj.TenantID, ProjectID: proj.ID, OwnerUserID: p.UserID, Name: spec.Name,
		AppSlug: v.AppSlug, AppVersion: v.Version, AppName: truncate(v.AppName, 120), ArtifactIDs: spec.ArtifactIDs, AllocationID: a.ID, AllocationCreated: created, NodeID: a.NodeID,
		Port: port, State: lifecycle.Requested, RunSpec: body, BootstrapSSH: v.BootstrapSSH, CreatedAt: now, UpdatedAt: now,
	}
	if i.ArtifactIDs == nil {
		i.ArtifactIDs = []uuid.UUID{}
	}
	_, err = tx.Exec(ctx, `INSERT INTO app_instances (id, tenant_id, project_id, owner_user_id, name, app_slug, app_version,
		app_name, artifact_ids, allocation_id, allocation_created, node_id, port, state, run_spec, bootstrap_ssh, created_at, updated_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $17)`,
		i.ID, i.TenantID, i.ProjectID, i.OwnerUserID, i.Name, i.AppSlug, i.AppVersion, i.AppName, i.ArtifactIDs, i.AllocationID,
		i.AllocationCreated, i.NodeID, i.Port, string(i.State), i.RunSpec, i.BootstrapSSH, now)
	if db.IsUniqueViolation(err, "app_instances_node_port_key") {
		return Instance{}, apierr.New(apierr.AppInstanceStateInvalid, "port %d is already served on this node", port).With("reason", "port_in_use")
	}
	if err != nil {
		return Instance{}, fmt.Errorf("insert app instance: %w", err)
	}
	meta := map[string]any{"app_slug": i.AppSlug, "version": i.AppVersion, "allocation_id": i.AllocationID.String(),
		"allocation_created": created, "port": port}
	if err := s.Audit.Record(ctx, tx, audit.Entry{Action: ActionCreate, TargetType: "app_instance", TargetID: i.ID.String(),
		TenantID: i.TenantID, ProjectID: i.ProjectID, Metadata: meta}); err != nil {
		return Instance{}, err
	}
	if err := s.publish(ctx, tx, i, ""); err != nil {
		return Instance{}, err
	}
	if allocationRuns(a.Status) {
		if err := s.requestStart(ctx, tx, i, a.SshPublicKeys); err != nil {
			return Instance{}, err
		}
	}
	return i, nil
}

// Stop stops an instance of the project (DELETE): a requested one at once, a started one
// through an app.stop task (stopping until the agent reports it stopped); a stopping,
// stopped or failed one is app_instance_state_invalid. An allocation launched for the
// instance is released in the same transaction.
func (s *Service) Stop(ctx context.Context, p *principal.Principal, proj projectctx.Project, id uuid.UUID) (Instance, error) {
	if _, err := s.Get(ctx, proj.ID, id); err != nil {
		return Instance{}, err
	}
	if !proj.AtLeast(projectctx.RoleMember) {
		return Instance{}, apierr.New(apierr.InsufficientPermissions, "viewers cannot stop app instances in this project").
			With("required_role", projectctx.RoleMember)
	}
	var out Instance
	err := s.within(ctx, func(tx pgx.Tx) error {
		i, err := lock(ctx, tx, id)
		if err != nil {
			return err
		}
		if out, _, err = s.transition(ctx, tx, i, move{event: lifecycle.Stop, reason: "stopped by request"}); err != nil {
			return err
		}
		if !out.AllocationCreated {
			return nil
		}
		_, err = s.Allocations.Release(db.WithTx(ctx, tx), p, proj, out.AllocationID)
		if e, ok := apierr.As(err); ok && (e.Code == apierr.AllocationAlreadyReleasing || e.Code == apierr.AllocationNotActive) {
			return nil // it is on its way out already
		}
		return err
	})
	if errors.Is(err, lifecycle.ErrUnknown) {
		return Instance{}, fmt.Errorf("stop app instance: %w", err)
	}
	return out, err
}
