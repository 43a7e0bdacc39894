package instances_test

import (
	"sync"
	"testing"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/apps/instances"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// The quota holds under concurrent launches: exactly the limit succeeds, the rest are
// app_instance_quota_exceeded, and no two instances share a port on the node.
func TestConcurrentLaunchesAtTheQuota(t *testing.T) {
	t.Parallel()
	w := newWorld(t, instances.Config{MaxPerProject: 3})
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for n := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[n] = w.launch(instances.LaunchSpec{AppSlug: "web", Version: "1.0", AllocationID: uuid.NullUUID{UUID: w.alloc.ID, Valid: true}})
		}()
	}
	wg.Wait()
	ok, quota := 0, 0
	for _, err := range errs {
		switch {
		case err == nil:
			ok++
		case apierr.CodeOf(err) == apierr.AppInstanceQuotaExceeded:
			quota++
		default:
			t.Errorf("unexpected: %v", err)
		}
	}
	if ok != 3 || quota != 5 {
		t.Fatalf("%d launched, %d refused; want 3 and 5", ok, quota)
	}
	if n := w.count(`SELECT count(DISTINCT port) FROM app_instances`); n != 3 {
		t.Fatalf("%d distinct ports for 3 instances", n)
	}
}

// Concurrent identical reports (an agent resending over two tunnels, two replicas) are
// still one audit row.
func TestConcurrentIdenticalReportsOneAuditRow(t *testing.T) {
	t.Parallel()
	w := newWorld(t, instances.Config{})
	i := w.started("web", "1.0")
	var wg sync.WaitGroup
	for n := 0; n < 20; n++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := w.report(i, "running", 5); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if got := w.audits(instances.ActionControllerReport, i.ID); got != 1 {
		t.Fatalf("%d audit rows, want 1", got)
	}
}
