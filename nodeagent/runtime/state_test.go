package runtime

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/gantry-gpu/gantry/shared/alloctask"
	"github.com/gantry-gpu/gantry/shared/clock"
)

// TestTransitionTable walks every phase × task kind on the process runtime, starting
// from a real allocation in that phase, and checks the phase it ends in and the error
// code. The expectations are written out here, not read from the table under test.
func TestTransitionTable(t *testing.T) {
	type want struct {
		phase Phase
		code  string
	}
	P, S, RS, RL := alloctask.KindProvision, alloctask.KindStop, alloctask.KindRestart, alloctask.KindRelease
	table := map[Phase]map[string]want{
		PhaseNone:         {P: {PhaseActive, ""}, S: {PhaseStopped, ""}, RS: {PhaseActive, ""}, RL: {PhaseReleased, ""}},
		PhaseProvisioning: {P: {PhaseActive, ""}, S: {PhaseStopped, ""}, RS: {PhaseActive, ""}, RL: {PhaseReleased, ""}},
		PhaseActive:       {P: {PhaseActive, ""}, S: {PhaseStopped, ""}, RS: {PhaseActive, ""}, RL: {PhaseReleased, ""}},
		PhaseStopped:      {P: {PhaseStopped, ""}, S: {PhaseStopped, ""}, RS: {PhaseActive, ""}, RL: {PhaseReleased, ""}},
		PhaseReleased: {
			P: {PhaseReleased, alloctask.CodeNotFound}, S: {PhaseReleased, ""},
			RS: {PhaseReleased, alloctask.CodeNotFound}, RL: {PhaseReleased, ""},
		},
	}
	gpus := mockGPUs(t)
	inv := inventory(t, gpus)
	ctx := context.Background()
	for from, kinds := range table {
		for kind, w := range kinds {
			t.Run(string(from)+"/"+kind, func(t *testing.T) {
				dir := t.TempDir()
				r := newProcessRuntime(t, dir, gpus)
				p := payload(t, inv, 4)
				var err error
				switch from {
				case PhaseProvisioning: // a provision the agent crashed in
					err = r.save(&record{AllocationID: p.AllocationID, Runtime: r.Name(), Phase: PhaseProvisioning, User: p.User})
				case PhaseActive:
					_, err = r.Provision(ctx, p)
				case PhaseStopped:
					if _, err = r.Provision(ctx, p); err == nil {
						err = r.Stop(ctx, p)
					}
				case PhaseReleased:
					if _, err = r.Provision(ctx, p); err == nil {
						err = r.Release(ctx, p)
					}
				}
				if err != nil || r.Phase(p.AllocationID) != from {
					t.Fatalf("setting up %q: %v (phase %q)", from, err, r.Phase(p.AllocationID))
				}
				res, err := apply(r, kind, p)
				if code(err) != w.code {
					t.Fatalf("err %v, want code %q", err, w.code)
				}
				if got := r.Phase(p.AllocationID); got != w.phase {
					t.Fatalf("phase %q, want %q", got, w.phase)
				}
				if (kind == P || kind == RS) && w.code == "" && res.User != p.User {
					t.Fatalf("result %+v", res)
				}
				_, live := r.Session(p.AllocationID)
				if live != (w.phase == PhaseActive) {
					t.Fatalf("session live=%v in phase %q", live, w.phase)
				}
				// What the table says is also what a restarted agent reads back.
				if w.phase != PhaseNone {
					if again := newProcessRuntime(t, dir, gpus); again.Phase(p.AllocationID) != w.phase {
						t.Fatalf("on disk %q", again.Phase(p.AllocationID))
					}
				}
			})
		}
	}
	// The table under test has exactly these cells.
	for from, kinds := range transitions {
		for kind := range kinds {
			if _, ok := table[from][kind]; !ok {
				t.Errorf("transition %q/%q is not tested", from, kind)
			}
		}
	}
}

func apply(r *Runtime, kind string, p alloctask.Payload) (alloctask.ProvisionResult, error) {
	ctx := context.Background()
	switch kind {
	case alloctask.KindProvision:
		return r.Provision(ctx, p)
	case alloctask.KindRestart:
		return r.Restart(ctx, p)
	case alloctask.KindStop:
		return alloctask.ProvisionResult{}, r.Stop(ctx, p)
	default:
		return alloctask.ProvisionResult{}, r.Release(ctx, p)
	}
}

// TestTombstonesExpire: a released allocation's record is kept TombstoneTTL (a late
// provision is refused meanwhile) and removed by the first start after that.
func TestTombstonesExpire(t *testing.T) {
	gpus := mockGPUs(t)
	inv := inventory(t, gpus)
	dir := t.TempDir()
	clk := clock.NewManual(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	open := func() *Runtime {
		r, err := New(Options{Driver: &Process{Root: filepath.Join(dir, "allocations")}, StateDir: dir, Inventory: gpus, AdvertiseHost: "h", Clock: clk})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	p := payload(t, inv, 0)
	if err := open().Release(context.Background(), p); err != nil {
		t.Fatal(err)
	}
	clk.Advance(TombstoneTTL)
	if r := open(); r.Phase(p.AllocationID) != PhaseReleased {
		t.Fatalf("tombstone gone at exactly the TTL: %q", r.Phase(p.AllocationID))
	}
	clk.Advance(time.Second)
	if r := open(); r.Phase(p.AllocationID) != PhaseNone {
		t.Fatalf("tombstone kept past the TTL: %q", r.Phase(p.AllocationID))
	}
	if _, err := os.Stat(filepath.Join(dir, "allocations", p.AllocationID+".json")); !os.IsNotExist(err) {
		t.Fatalf("tombstone file: %v", err)
	}
}

// TestCorruptRecordRefusesToStart: a record that does not parse stops the runtime from
// opening rather than being treated as unknown (which could hand its account on).
func TestCorruptRecordRefusesToStart(t *testing.T) {
	gpus := mockGPUs(t)
	dir := t.TempDir()
	r := newProcessRuntime(t, dir, gpus)
	p := payload(t, inventory(t, gpus), 0)
	if _, err := r.Provision(context.Background(), p); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "allocations", p.AllocationID+".json")
	if err := os.WriteFile(path, []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := New(Options{Driver: &Process{Root: filepath.Join(dir, "allocations")}, StateDir: dir, Inventory: gpus, AdvertiseHost: "h"}); err == nil {
		t.Fatal("opened over a corrupt record")
	}
	// A record written by the runtime round-trips.
	b, _ := json.Marshal(record{AllocationID: p.AllocationID, Runtime: "process", Phase: PhaseActive, User: p.User})
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if again := newProcessRuntime(t, dir, gpus); again.Phase(p.AllocationID) != PhaseActive {
		t.Fatalf("phase %q", again.Phase(p.AllocationID))
	}
}

// TestRuntimeMismatchRefused: an allocation set up by one runtime is not operated by
// another (the agent's runtime setting changed under live allocations).
func TestRuntimeMismatchRefused(t *testing.T) {
	gpus := mockGPUs(t)
	dir := t.TempDir()
	r := newProcessRuntime(t, dir, gpus)
	p := payload(t, inventory(t, gpus), 0)
	if err := r.save(&record{AllocationID: p.AllocationID, Runtime: NameLinuxUser, Phase: PhaseActive, User: p.User}); err != nil {
		t.Fatal(err)
	}
	if err := r.Release(context.Background(), p); code(err) != alloctask.CodeRuntimeFailed {
		t.Fatalf("err %v", err)
	}
	if r.Phase(p.AllocationID) != PhaseActive {
		t.Fatalf("phase %q", r.Phase(p.AllocationID))
	}
}
