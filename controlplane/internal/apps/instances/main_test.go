package instances_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/crypto/ssh"

	"github.com/gantry-gpu/gantry/controlplane/internal/allocations"
	"github.com/gantry-gpu/gantry/controlplane/internal/apps/instances"
	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/controlplane/internal/projectctx"
	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
	"github.com/gantry-gpu/gantry/shared/apierr"
	"github.com/gantry-gpu/gantry/shared/clock"
	"github.com/gantry-gpu/gantry/shared/ids"
	"github.com/gantry-gpu/gantry/shared/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

var template = testenv.Template{Name: "controlplane", Version: db.SchemaVersion(), Migrate: db.Migrate, Configure: db.ConfigurePool, AppRole: db.AppRole}

// catalog is the app catalog as a launch sees it: versions by slug@version, the
// entitled tenants, deprecated versions. (The apps package implements the interface
// over its tables; this suite exercises what instances does with its answers.)
type catalog struct {
	versions   map[string]instances.Version
	deprecated map[string]bool
	entitled   map[uuid.UUID]bool
}

func (c *catalog) LaunchVersion(_ context.Context, tenant uuid.UUID, slug, version string) (instances.Version, error) {
	found := false
	for k := range c.versions {
		found = found || strings.HasPrefix(k, slug+"@")
	}
	if !found {
		return instances.Version{}, apierr.NotFound(apierr.AppNotFound, "app")
	}
	v, ok := c.versions[slug+"@"+version]
	if !ok || c.deprecated[slug+"@"+version] {
		return instances.Version{}, apierr.NotFound(apierr.AppVersionNotFound, "app version")
	}
	if !c.entitled[tenant] {
		return instances.Version{}, apierr.New(apierr.AppNotEntitled, "not entitled")
	}
	return v, nil
}

// allocs holds allocations by id. Create writes a real allocations row in the launch's
// transaction (db.TxFrom), so a launch that fails after it proves the row rolled back.
type allocs struct {
	mu       sync.Mutex
	m        map[uuid.UUID]allocations.Allocation
	created  int
	sku      map[string]int32 // sku -> GPUs; absent: sku_not_found
	node     uuid.UUID
	sawTx    bool
	released []uuid.UUID
	// releasedBySystem: allocations released because the instance launched on them failed.
	releasedBySystem []uuid.UUID
}

func (a *allocs) Get(_ context.Context, projectID, id uuid.UUID) (allocations.Allocation, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	x, ok := a.m[id]
	if !ok || x.ProjectID != projectID {
		return allocations.Allocation{}, apierr.NotFound(apierr.AllocationNotFound, "allocation")
	}
	return x, nil
}

func (a *allocs) Create(ctx context.Context, p *principal.Principal, proj projectctx.Project, spec allocations.CreateSpec) (allocations.Allocation, error) {
	gpus, ok := a.sku[spec.SKU]
	if !ok {
		return allocations.Allocation{}, apierr.NotFound(apierr.SKUNotFound, "sku")
	}
	tx, ok := db.TxFrom(ctx)
	if !ok {
		return allocations.Allocation{}, errors.New("allocation create outside the launch transaction")
	}
	x := allocations.Allocation{ID: uuid.Must(uuid.NewV7()), TenantID: proj.TenantID, ProjectID: proj.ID, OwnerUserID: p.UserID,
		Name: spec.Name, Sku: spec.SKU, GpuModel: "NVIDIA H100 80GB HBM3", GpuCount: gpus, NodeID: a.node, Status: "requested",
		SshPublicKeys: []string{}}
	if _, err := tx.Exec(ctx, `INSERT INTO allocations (id, tenant_id, project_id, owner_user_id, name, sku, gpu_model, gpu_count,
		usage_unit, region_code, node_id, ssh_key_ids, ssh_public_keys, status, created_at, updated_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 'gpu.h100', 'eu-west-1', $9, '{}', '{}', 'requested', now(), now())`,
		x.ID, x.TenantID, x.ProjectID, x.OwnerUserID, x.Name, x.Sku, x.GpuModel, x.GpuCount, x.NodeID); err != nil {
		return allocations.Allocation{}, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.m[x.ID] = x
	a.created++
	a.sawTx = true
	return x, nil
}

func (a *allocs) Release(_ context.Context, _ *principal.Principal, proj projectctx.Project, id uuid.UUID) (allocations.Allocation, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	x, ok := a.m[id]
	if !ok || x.ProjectID != proj.ID {
		return allocations.Allocation{}, apierr.NotFound(apierr.AllocationNotFound, "allocation")
	}
	a.released = append(a.released, id)
	x.Status = "releasing"
	a.m[id] = x
	return x, nil
}

func (a *allocs) ReleaseAsSystem(_ context.Context, projectID, id uuid.UUID, _ string) (allocations.Allocation, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	x, ok := a.m[id]
	if !ok || x.ProjectID != projectID {
		return allocations.Allocation{}, apierr.NotFound(apierr.AllocationNotFound, "allocation")
	}
	a.releasedBySystem = append(a.releasedBySystem, id)
	x.Status = "releasing"
	a.m[id] = x
	return x, nil
}

func (a *allocs) set(id uuid.UUID, status string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	x := a.m[id]
	x.Status = status
	a.m[id] = x
}

// node records dispatched tasks and answers with ack (nil: ACCEPTED); offline answers
// an error.
type node struct {
	mu      sync.Mutex
	tasks   []*fabricv1.TaskDispatch
	ack     *fabricv1.TaskAck
	offline bool
}

func (n *node) Dispatch(_ context.Context, _ uuid.UUID, t *fabricv1.TaskDispatch) (*fabricv1.TaskAck, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.offline {
		return nil, errors.New("fabric: node offline")
	}
	n.tasks = append(n.tasks, t)
	if n.ack != nil {
		return n.ack, nil
	}
	return &fabricv1.TaskAck{TaskId: t.TaskId, Status: fabricv1.TaskAckStatus_TASK_ACK_STATUS_ACCEPTED}, nil
}

type world struct {
	t      *testing.T
	pool   *pgxpool.Pool
	clk    *clock.Manual
	svc    *instances.Service
	cat    *catalog
	allocs *allocs
	node   *node
	nodeID uuid.UUID
	caller *principal.Principal
	proj   projectctx.Project
	other  projectctx.Project
	alloc  allocations.Allocation // active, 2 GPUs, in proj
	ctx    context.Context
}

func newWorld(t *testing.T, cfg instances.Config) *world {
	t.Helper()
	pool := testenv.NewDatabase(t, template)
	clk := clock.NewManual(time.Date(2026, 11, 26, 1, 0, 0, 0, time.UTC))
	w := &world{t: t, pool: pool, clk: clk, nodeID: uuid.Must(uuid.NewV7())}
	tenant := uuid.Must(uuid.NewV7())
	w.caller = &principal.Principal{UserID: uuid.Must(uuid.NewV7())}
	w.proj = projectctx.Project{ID: uuid.Must(uuid.NewV7()), TenantID: tenant, Role: projectctx.RoleMember}
	w.other = projectctx.Project{ID: uuid.Must(uuid.NewV7()), TenantID: uuid.Must(uuid.NewV7()), Role: projectctx.RoleOwner}
	w.cat = &catalog{
		versions: map[string]instances.Version{
			"web@1.0": {AppSlug: "web", AppName: "Web", Kind: "app", Version: "1.0",
				Command: []string{"python3", "-m", "http.server", "{port}", "--bind", "127.0.0.1"},
				Health:  instances.HealthCheck{Type: "http", Path: "/"}, MinGPUs: 1},
			"web@0.9": {AppSlug: "web", Version: "0.9", Command: []string{"true"}},
			"big@1":   {AppSlug: "big", Version: "1", Command: []string{"train"}, MinGPUs: 4},
			"whole@1": {AppSlug: "whole", Version: "1", Command: []string{"vllm"}, WholeAllocation: true},
			"fixed@1": {AppSlug: "fixed", Version: "1", Command: []string{"jupyter", "--port=8888"}, Port: 8888},
			"ssh@1":   {AppSlug: "ssh", Version: "1", Command: []string{"mpirun"}, BootstrapSSH: true},
			"h200@1":  {AppSlug: "h200", Version: "1", Command: []string{"x"}, GPUModel: "NVIDIA H200"},
		},
		deprecated: map[string]bool{"web@0.9": true},
		entitled:   map[uuid.UUID]bool{tenant: true, w.other.TenantID: true},
	}
	w.alloc = allocations.Allocation{ID: uuid.Must(uuid.NewV7()), TenantID: tenant, ProjectID: w.proj.ID, GpuCount: 2,
		GpuModel: "NVIDIA H100 80GB HBM3", NodeID: w.nodeID, Status: "active", SshPublicKeys: []string{sshKey(t)}}
	w.allocs = &allocs{m: map[uuid.UUID]allocations.Allocation{w.alloc.ID: w.alloc}, sku: map[string]int32{"h100.1x": 1, "h100.2x": 2}, node: w.nodeID}
	w.node = &node{}
	w.svc = instances.New(pool, clk, ids.V7{}, cfg, w.cat, w.allocs, w.node, nil)
	w.ctx = principal.With(context.Background(), w.caller)
	return w
}

func sshKey(t testing.TB) string {
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	sp, _ := ssh.NewPublicKey(pub)
	return strings.TrimSpace(string(ssh.MarshalAuthorizedKey(sp)))
}

func (w *world) launch(spec instances.LaunchSpec) (instances.Instance, error) {
	if spec.Name == "" {
		spec.Name = "notebook"
	}
	return w.svc.Launch(w.ctx, w.caller, w.proj, spec)
}

func (w *world) mustLaunch(slug, version string) instances.Instance {
	w.t.Helper()
	i, err := w.launch(instances.LaunchSpec{AppSlug: slug, Version: version, AllocationID: uuid.NullUUID{UUID: w.alloc.ID, Valid: true}})
	if err != nil {
		w.t.Fatalf("launch %s@%s: %v", slug, version, err)
	}
	return i
}

// started launches slug@version on the world's allocation and lets the reconcile pass
// deliver its app.start (the node takes it: starting).
func (w *world) started(slug, version string) instances.Instance {
	w.t.Helper()
	i := w.mustLaunch(slug, version)
	if err := w.svc.Reconcile(context.Background()); err != nil {
		w.t.Fatal(err)
	}
	i = w.get(i.ID)
	if i.State != "starting" {
		w.t.Fatalf("after delivery: %s", i.State)
	}
	return i
}

func (w *world) count(query string, args ...any) int {
	w.t.Helper()
	var n int
	if err := w.pool.QueryRow(context.Background(), query, args...).Scan(&n); err != nil {
		w.t.Fatalf("%s: %v", query, err)
	}
	return n
}

func (w *world) audits(action string, id uuid.UUID) int {
	return w.count(`SELECT count(*) FROM audit_events WHERE action = $1 AND target_id = $2`, action, id.String())
}

func (w *world) report(i instances.Instance, state string, gen uint64) error {
	_, err := w.svc.ApplyReport(context.Background(), i.NodeID, instances.Report{InstanceID: i.ID, State: state, Generation: gen})
	return err
}

func (w *world) get(id uuid.UUID) instances.Instance {
	w.t.Helper()
	i, err := w.svc.Get(context.Background(), w.proj.ID, id)
	if err != nil {
		w.t.Fatal(err)
	}
	return i
}

func wantCode(t *testing.T, err error, code apierr.Code) *apierr.Error {
	t.Helper()
	e, ok := apierr.As(err)
	if !ok || e.Code != code {
		t.Fatalf("got %v, want %s", err, code)
	}
	return e
}
