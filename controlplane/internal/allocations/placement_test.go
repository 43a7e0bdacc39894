package allocations_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/gantry-gpu/gantry/proto/api"
)

// launcher is a tenant's admin with a key and a funded wallet, launching in its default
// project: launches of different projects do not serialize on a project's lock, so
// their placements race for the same GPUs.
type launcher struct {
	c       *api.ClientWithResponses
	project uuid.UUID
}

func (w *world) launchers(t *testing.T, n int) []launcher {
	t.Helper()
	_, root := w.PlatformAdmin(t)
	out := []launcher{{c: w.Alice, project: w.Acme.DefaultProject}}
	for i := 1; i < n; i++ {
		tn := w.NewTenant(t, root, fmt.Sprintf("Racer %d", i))
		c := w.Client(tn.AdminToken)
		w.addKey(t, c)
		w.credit(t, tn.ID, 1_000_000)
		out = append(out, launcher{c: c, project: tn.DefaultProject})
	}
	return out
}

// race sends n creates of sku at once, spread over ls, and returns the allocations
// created; every other answer must be 409 sku_unavailable.
func (w *world) race(t *testing.T, ls []launcher, sku string, n int) []api.Allocation {
	t.Helper()
	var wg sync.WaitGroup
	answers := make([]*api.CreateAllocationHTTPResponse, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l := ls[i%len(ls)]
			r, err := w.create(l.c, l.project, "", api.CreateAllocationJSONRequestBody{Name: fmt.Sprintf("race-%d", i), Sku: sku})
			if err != nil {
				t.Error(err)
				return
			}
			answers[i] = r
		}()
	}
	wg.Wait()
	var created []api.Allocation
	for _, r := range answers {
		switch {
		case r == nil:
			t.FailNow()
		case r.StatusCode() == 201:
			created = append(created, *r.JSON201)
		default:
			wantError(t, r.Body, r.StatusCode(), 409, "sku_unavailable", "")
		}
	}
	return created
}

// heldConsistent checks what a race left: every allocation holds exactly its
// gpu_count GPUs, all on its own node, no GPU is held twice, no other GPU row exists,
// and nothing else was written.
func (w *world) heldConsistent(t *testing.T, created []api.Allocation) {
	t.Helper()
	gpus := 0
	for _, a := range created {
		gpus += a.GpuCount
		if n := w.count(t, `SELECT count(*) FROM allocation_gpus g JOIN allocations a ON a.id = g.allocation_id
			WHERE g.allocation_id = $1 AND g.node_id = a.node_id AND g.released_at IS NULL`, a.ID); n != a.GpuCount {
			t.Fatalf("allocation %s holds %d GPUs on its node %s, want %d", a.ID, n, a.NodeID, a.GpuCount)
		}
	}
	if held, distinct := w.count(t, `SELECT count(*) FROM allocation_gpus WHERE released_at IS NULL`),
		w.count(t, `SELECT count(DISTINCT (node_id, gpu_uuid)) FROM allocation_gpus WHERE released_at IS NULL`); held != gpus || distinct != held {
		t.Fatalf("held %d GPUs, %d distinct, for %d allocations of %d GPUs in all", held, distinct, len(created), gpus)
	}
	if n := w.count(t, `SELECT count(*) FROM allocation_gpus`); n != gpus {
		t.Fatalf("%d allocation_gpus rows, want %d (a lost claim left a row)", n, gpus)
	}
	c := len(created)
	if got := w.writes(t); got != [6]int{c, c, gpus, c, c, c} {
		t.Fatalf("writes: %v for %d allocations of %d GPUs in all", got, c, gpus)
	}
	if n := w.count(t, `SELECT count(*) FROM outbox_events WHERE event_type = 'provisioning.dispatch'`); n != c {
		t.Fatalf("dispatch events: %d, want %d", n, c)
	}
}

// Launches of different projects claim GPUs optimistically (no lock between them): 60 at
// once against 6 free GPUs make exactly 6 allocations, each GPU held once, the others
// sku_unavailable with nothing written.
func TestConcurrentCreatesAcrossProjects(t *testing.T) {
	w := newWorld(t, 1000)
	w.node(t, "a", 3)
	w.node(t, "b", 3)
	ls := w.launchers(t, 6)
	created := w.race(t, ls, sku1x, 60)
	if len(created) != 6 {
		t.Fatalf("created %d allocations, want 6", len(created))
	}
	w.heldConsistent(t, created)
}

// A multi-GPU launch that gets only some GPUs of a node (single-GPU launches took the
// others meanwhile) gives them back before it tries the next node: 2-GPU and 1-GPU
// launches of six projects at once against three 4-GPU nodes fill the fleet exactly,
// every allocation holding its GPUs on its own node and no GPU held twice.
func TestConcurrentMultiGPUCreatesAcrossProjects(t *testing.T) {
	w := newWorld(t, 1000)
	const sku2x = "h100-80gb-sxm.2x"
	w.sku(t, sku2x, 2)
	w.node(t, "a", 4)
	w.node(t, "b", 4)
	w.node(t, "c", 4)
	ls := w.launchers(t, 6)
	var wg sync.WaitGroup
	var doubles, singles []api.Allocation
	wg.Add(2)
	go func() { defer wg.Done(); doubles = w.race(t, ls, sku2x, 12) }()
	go func() { defer wg.Done(); singles = w.race(t, ls, sku1x, 12) }()
	wg.Wait()
	if held := 2*len(doubles) + len(singles); held != 12 {
		t.Fatalf("%d two-GPU and %d one-GPU allocations hold %d GPUs, want the whole fleet (12)", len(doubles), len(singles), held)
	}
	for _, a := range doubles {
		if n := w.count(t, `SELECT count(*) FROM allocation_gpus g JOIN allocations a ON a.id = g.allocation_id
			WHERE g.allocation_id = $1 AND g.node_id = a.node_id AND g.released_at IS NULL`, a.ID); n != 2 {
			t.Fatalf("allocation %s holds %d GPUs on its node, want 2", a.ID, n)
		}
	}
	w.heldConsistent(t, append(doubles, singles...))
}

// Groups place alone (the GPU model's lock, exclusive) while single launches of other
// projects race each other: launched all at once, nothing waits forever, no GPU is
// held twice, and every group is whole or absent.
func TestGroupsAndSinglesAtOnce(t *testing.T) {
	w := newWorld(t, 1000)
	w.node(t, "a", 4)
	w.node(t, "b", 4)
	w.node(t, "c", 2)
	ls := w.launchers(t, 4)
	var wg sync.WaitGroup
	type answer struct {
		status int
		body   []byte
	}
	answers := make([]answer, 8)
	for i := range answers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l := ls[i%len(ls)]
			r := w.createGroup(l.c, l.project, "", api.CreateAllocationGroupJSONRequestBody{Name: fmt.Sprintf("gang-%d", i), Sku: sku1x, Count: 3})
			answers[i] = answer{r.StatusCode(), r.Body}
		}()
	}
	singles := w.race(t, ls, sku1x, 12)
	wg.Wait()
	for _, a := range answers {
		if a.status != 201 {
			wantError(t, a.body, a.status, 409, "sku_unavailable", "")
		}
	}
	groups := w.count(t, `SELECT count(*) FROM allocation_groups`)
	if n := w.count(t, `SELECT count(*) FROM allocations`); n != len(singles)+3*groups {
		t.Fatalf("%d allocations for %d singles and %d groups of 3", n, len(singles), groups)
	}
	if partial := w.count(t, `SELECT count(*) FROM allocation_groups g
		WHERE (SELECT count(*) FROM allocations a WHERE a.group_id = g.id) <> g.member_count`); partial != 0 {
		t.Fatalf("%d partial groups", partial)
	}
	held := w.count(t, `SELECT count(*) FROM allocation_gpus WHERE released_at IS NULL`)
	if distinct := w.count(t, `SELECT count(DISTINCT (node_id, gpu_uuid)) FROM allocation_gpus WHERE released_at IS NULL`); held != distinct || held != len(singles)+3*groups {
		t.Fatalf("held %d GPUs, %d distinct, for %d singles and %d groups", held, distinct, len(singles), groups)
	}
	// 10 GPUs: whatever the interleaving, the fleet ends full (a group of 3 that does
	// not fit leaves room only for singles, and 12 singles were sent).
	if held != 10 {
		t.Fatalf("held %d GPUs, want the whole fleet (10)", held)
	}
}

// holdOpen reserves GPU gpu of node for a made-up live allocation in a transaction it
// leaves open: a create that reaches for that GPU waits for it.
func (w *world) holdOpen(t *testing.T, node uuid.UUID, gpu string) pgx.Tx {
	t.Helper()
	ctx := context.Background()
	tx, err := w.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	id := uuid.New()
	if _, err := tx.Exec(ctx, `INSERT INTO allocations (id, tenant_id, project_id, owner_user_id, name, sku, gpu_model,
		gpu_count, usage_unit, region_code, node_id, ssh_key_ids, ssh_public_keys, status, created_at, updated_at)
		VALUES ($1, $1, $1, $1, 'other', $2, $3, 1, $4, $5, $6, '{}', '{}', 'requested', now(), now())`,
		id, sku1x, h100, unit, region, node); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO allocation_gpus (allocation_id, node_id, gpu_uuid, gpu_index, reserved_at)
		SELECT $1, node_id, gpu_uuid, gpu_index, now() FROM node_gpus WHERE node_id = $2 AND gpu_uuid = $3`, id, node, gpu); err != nil {
		t.Fatal(err)
	}
	return tx
}

// awaitClaimWaiting returns once a transaction of the test's database waits for another
// one (the create's claim waiting for the open hold).
func (w *world) awaitClaimWaiting(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if w.count(t, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
			AND wait_event_type = 'Lock' AND wait_event = 'transactionid'`) > 0 {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("no create waited for the open hold")
}

func wantCreated(t *testing.T, r *api.CreateAllocationHTTPResponse) {
	t.Helper()
	if r == nil {
		t.Fatal("create: no answer")
	}
	if r.StatusCode() != 201 {
		t.Fatalf("create: %d %s", r.StatusCode(), r.Body)
	}
}

func (w *world) heldBy(t *testing.T, id uuid.UUID) string {
	t.Helper()
	var s string
	if err := w.Pool.QueryRow(context.Background(), `SELECT coalesce(string_agg(gpu_uuid, ',' ORDER BY gpu_uuid), '')
		FROM allocation_gpus WHERE allocation_id = $1 AND released_at IS NULL`, id).Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

// A claim waits for a GPU another transaction is reserving, then moves on to the next
// free GPU when that one commits, or takes it when that one rolls back.
func TestClaimWaitsThenMovesOn(t *testing.T) {
	for _, commit := range []bool{true, false} {
		t.Run(fmt.Sprintf("other commits=%v", commit), func(t *testing.T) {
			w := newWorld(t, 16)
			ctx := context.Background()
			node := w.node(t, "a", 3)
			hold := w.holdOpen(t, node, "GPU-a-0")
			done := make(chan *api.CreateAllocationHTTPResponse, 1)
			go func() {
				r, _ := w.create(w.Alice, w.Acme.DefaultProject, "", api.CreateAllocationJSONRequestBody{Name: "waits", Sku: sku1x})
				done <- r
			}()
			w.awaitClaimWaiting(t)
			want := "GPU-a-1"
			if commit {
				if err := hold.Commit(ctx); err != nil {
					t.Fatal(err)
				}
			} else {
				if err := hold.Rollback(ctx); err != nil {
					t.Fatal(err)
				}
				want = "GPU-a-0"
			}
			r := <-done
			wantCreated(t, r)
			if got := w.heldBy(t, r.JSON201.ID); got != want || r.JSON201.NodeID != node {
				t.Fatalf("holds %q on %s, want %q", got, r.JSON201.NodeID, want)
			}
		})
	}
}

// A multi-GPU claim that got only some of a node's GPUs rolls them back before it
// claims again: a 2-GPU create reaching for GPUs 0 and 1 of a 3-GPU node, while another
// transaction reserves GPU 1 and commits, ends with GPUs 0 and 2, and nothing else.
func TestPartialClaimGivesBack(t *testing.T) {
	w := newWorld(t, 16)
	ctx := context.Background()
	const sku2x = "h100-80gb-sxm.2x"
	w.sku(t, sku2x, 2)
	node := w.node(t, "a", 3)
	hold := w.holdOpen(t, node, "GPU-a-1")
	done := make(chan *api.CreateAllocationHTTPResponse, 1)
	go func() {
		r, _ := w.create(w.Alice, w.Acme.DefaultProject, "", api.CreateAllocationJSONRequestBody{Name: "pair", Sku: sku2x})
		done <- r
	}()
	w.awaitClaimWaiting(t)
	if err := hold.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	wantCreated(t, r)
	if got := w.heldBy(t, r.JSON201.ID); got != "GPU-a-0,GPU-a-2" {
		t.Fatalf("holds %q, want GPU-a-0,GPU-a-2", got)
	}
	if n := w.count(t, `SELECT count(*) FROM allocation_gpus WHERE allocation_id = $1`, r.JSON201.ID); n != 2 {
		t.Fatalf("%d GPU rows for the allocation, want 2", n)
	}
}
