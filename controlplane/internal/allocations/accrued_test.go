package allocations_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/allocations"
	"github.com/gantry-gpu/gantry/proto/api"
)

func (w *world) accrued(t *testing.T, id uuid.UUID) *api.Money {
	t.Helper()
	return w.status(t, id).AccruedCost
}

func wantMoney(t *testing.T, got *api.Money, minor int64) {
	t.Helper()
	if got == nil || *got != (api.Money{AmountMinor: minor, Currency: "USD"}) {
		t.Fatalf("accrued_cost %+v, want %d USD", got, minor)
	}
}

// accrued_cost is null until the allocation is active, grows with the time it runs
// (rated or not yet), and stops growing once billing stops.
func TestAccruedCost(t *testing.T) {
	w, clk := clockWorld(t, 16)
	ctx := context.Background()
	node := w.node(t, "n", 2)
	proj := w.Acme.DefaultProject
	a := w.mustCreate(t, "train")
	if a.AccruedCost != nil || w.accrued(t, a.ID) != nil {
		t.Fatal("accrued cost before the allocation ran")
	}
	w.activate(t, node, a.ID)
	wantMoney(t, w.accrued(t, a.ID), 0)

	// 0.001 USD per GPU-second: 3.60 USD an hour, not rated yet.
	clk.Advance(time.Hour)
	wantMoney(t, w.accrued(t, a.ID), 360)
	// Rating books it; the figure is the same.
	if _, err := w.App.Billing.RateRunning(ctx, clk.Now(), 500); err != nil {
		t.Fatal(err)
	}
	if n := w.count(t, `SELECT coalesce(sum(amount_minor), 0)::int FROM billing_rated_usage_lines l JOIN billing_usage_records r ON r.id = l.usage_record_id WHERE r.source_id = $1`, a.ID); n != 360 {
		t.Fatalf("booked: %d", n)
	}
	wantMoney(t, w.accrued(t, a.ID), 360)
	// Booked plus the running part.
	clk.Advance(30 * time.Minute)
	wantMoney(t, w.accrued(t, a.ID), 540)

	// Releasing is billed until the node acknowledges; released stops it.
	rel, _ := w.Alice.ReleaseAllocationWithResponse(ctx, a.ID, &api.ReleaseAllocationParams{XProjectID: proj})
	if rel.StatusCode() != 200 || rel.JSON200.AccruedCost == nil || rel.JSON200.AccruedCost.AmountMinor != 540 {
		t.Fatalf("release: %s", rel.Body)
	}
	clk.Advance(30 * time.Minute)
	if err := w.report(t, node, w.task(t, a.ID, allocations.TaskRelease), true, ""); err != nil {
		t.Fatal(err)
	}
	wantMoney(t, w.accrued(t, a.ID), 720)
	clk.Advance(5 * time.Hour)
	wantMoney(t, w.accrued(t, a.ID), 720)
	l, _ := w.Alice.ListAllocationsWithResponse(ctx, &api.ListAllocationsParams{XProjectID: proj})
	if l.StatusCode() != 200 || len(l.JSON200.Items) != 1 {
		t.Fatalf("list: %s", l.Body)
	}
	wantMoney(t, l.JSON200.Items[0].AccruedCost, 720)
}
