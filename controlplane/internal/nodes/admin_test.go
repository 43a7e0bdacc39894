package nodes_test

import (
	"context"
	"errors"
	"net/netip"
	"testing"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/nodes"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

func TestScheduleTransitionTable(t *testing.T) {
	states := []nodes.ScheduleState{nodes.Schedulable, nodes.Cordoned, nodes.Draining, nodes.Drained}
	want := map[nodes.ScheduleAction]map[nodes.ScheduleState]nodes.ScheduleState{
		nodes.ActionCordon:        {nodes.Schedulable: nodes.Cordoned, nodes.Cordoned: nodes.Cordoned},
		nodes.ActionUncordon:      {nodes.Schedulable: nodes.Schedulable, nodes.Cordoned: nodes.Schedulable, nodes.Draining: nodes.Schedulable, nodes.Drained: nodes.Schedulable},
		nodes.ActionDrain:         {nodes.Schedulable: nodes.Draining, nodes.Cordoned: nodes.Draining, nodes.Draining: nodes.Draining, nodes.Drained: nodes.Drained},
		nodes.ActionDrainComplete: {nodes.Draining: nodes.Drained, nodes.Drained: nodes.Drained},
	}
	for action, row := range want {
		for _, from := range states {
			to, err := nodes.Transition(from, action)
			exp, allowed := row[from]
			switch {
			case allowed && (err != nil || to != exp):
				t.Errorf("%s from %s: %s %v, want %s", action, from, to, err, exp)
			case !allowed && !errors.Is(err, nodes.ErrTransition):
				t.Errorf("%s from %s: %s %v, want refused", action, from, to, err)
			}
		}
	}
}

func TestChangeSchedule(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	n := f.node(t, "gpu-1", "10.0.0.1")
	audits := func() int {
		return f.count(t, `SELECT count(*) FROM audit_events WHERE target_id = $1 AND action IN ('node.cordon','node.uncordon','node.drain','node.drain_complete')`, n.ID.String())
	}
	set := func(s nodes.ScheduleState) {
		if _, err := f.pool.Exec(ctx, `UPDATE nodes SET schedule_state = $2 WHERE id = $1`, n.ID, string(s)); err != nil {
			t.Fatal(err)
		}
	}
	// Every operator action from every state, against the database.
	states := []nodes.ScheduleState{nodes.Schedulable, nodes.Cordoned, nodes.Draining, nodes.Drained}
	for _, action := range []nodes.ScheduleAction{nodes.ActionCordon, nodes.ActionUncordon, nodes.ActionDrain} {
		for _, from := range states {
			set(from)
			before := audits()
			got, err := f.svc.ChangeSchedule(ctx, n.ID, action)
			exp, terr := nodes.Transition(from, action)
			if exp == nodes.Draining { // nothing runs here: the drain completes at once
				exp = nodes.Drained
			}
			if terr != nil {
				e, ok := apierr.As(err)
				if !ok || e.HTTPStatus() != 409 || e.Details["reason"] != "schedule_transition_invalid" {
					t.Errorf("%s from %s: %v, want 409 schedule_transition_invalid", action, from, err)
				}
				if audits() != before {
					t.Errorf("%s from %s: refused move audited", action, from)
				}
				continue
			}
			if err != nil || nodes.ScheduleState(got.ScheduleState) != exp {
				t.Errorf("%s from %s: %v %v, want %s", action, from, got.ScheduleState, err, exp)
			}
			if changed := exp != from; (audits() == before+1) != changed {
				t.Errorf("%s from %s: audit rows %d -> %d", action, from, before, audits())
			}
		}
	}
	// With allocations running, drain stays draining until SettleDrain finds it empty.
	set(nodes.Schedulable)
	held := heldGPUs{n.ID: {"GPU-0"}}
	f.svc.Allocations = held
	got, err := f.svc.ChangeSchedule(ctx, n.ID, nodes.ActionDrain)
	if err != nil || got.ScheduleState != string(nodes.Draining) {
		t.Fatalf("drain in use: %v %v", got.ScheduleState, err)
	}
	if err := f.svc.SettleDrain(ctx, n.ID); err != nil {
		t.Fatal(err)
	}
	if got, _ := f.svc.Get(ctx, n.ID); got.ScheduleState != string(nodes.Draining) {
		t.Fatal("settled while in use")
	}
	delete(held, n.ID)
	if err := f.svc.SettleDrain(ctx, n.ID); err != nil {
		t.Fatal(err)
	}
	if got, _ := f.svc.Get(ctx, n.ID); got.ScheduleState != string(nodes.Drained) {
		t.Fatal("not drained after the last allocation")
	}
	_, err = f.svc.ChangeSchedule(ctx, uuid.New(), nodes.ActionCordon)
	wantCode(t, err, apierr.NodeNotFound, 404)
}

func TestCreateUpdateDelete(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	n := f.node(t, "gpu-1", "10.0.0.1")
	if n.Status != nodes.StatusPending || n.ScheduleState != "schedulable" || n.ProbePort != 22 ||
		!n.LastProbeReachable.Bool || n.LastProbeAt == nil || f.dialer.count() != 1 || f.dialer.dials[0] != "10.0.0.1:22" {
		t.Fatalf("created %+v, dials %v", n.Node, f.dialer.dials)
	}
	nodesNow := func() int { return f.count(t, `SELECT count(*) FROM nodes`) }

	// Denied targets: 400, nothing stored, nothing dialled.
	for _, addr := range []string{"127.0.0.1", "169.254.169.254", "2852039166", "0251.0376.0251.0376", "::ffff:169.254.169.254", "fd00:ec2::254", "100.100.100.200", "ff02::1", "0.0.0.0"} {
		_, err := f.svc.Create(ctx, nodes.Spec{Name: "bad", Address: addr})
		e, ok := apierr.As(err)
		if !ok || e.Code != apierr.InvalidRequest || e.HTTPStatus() != 400 || e.Details["reason"] != "probe_target_denied" {
			t.Errorf("%s: %v", addr, err)
		}
	}
	if nodesNow() != 1 || f.dialer.count() != 1 {
		t.Fatalf("denied creates stored %d nodes / dialled %d", nodesNow(), f.dialer.count())
	}
	_, err := f.svc.Create(ctx, nodes.Spec{Name: "bad", Address: "not an address"})
	wantCode(t, err, apierr.ValidationError, 422)
	_, err = f.svc.Create(ctx, nodes.Spec{Name: "Bad_Name", Address: "10.0.0.9"})
	wantCode(t, err, apierr.ValidationError, 422)
	_, err = f.svc.Create(ctx, nodes.Spec{Name: "gpu-1", Address: "10.0.0.9"})
	wantCode(t, err, apierr.NodeAlreadyExists, 409)
	_, err = f.svc.Create(ctx, nodes.Spec{Name: "gpu-9", Address: "::ffff:10.0.0.1"}) // the same address, spelled otherwise
	wantCode(t, err, apierr.NodeAlreadyExists, 409)
	port := 2222
	if _, err := f.svc.Create(ctx, nodes.Spec{Name: "gpu-9", Address: "10.0.0.1", ProbePort: &port}); err != nil {
		t.Fatalf("same address, other port: %v", err)
	}

	// Update: no change writes nothing; a denied address is refused and leaves the node.
	audits := func() int { return f.count(t, `SELECT count(*) FROM audit_events WHERE action = 'node.update'`) }
	name := "gpu-1"
	if _, err := f.svc.Update(ctx, n.ID, nodes.Patch{Name: &name}); err != nil || audits() != 0 {
		t.Fatalf("no-op update: %v, %d audits", err, audits())
	}
	bad := "169.254.169.254"
	_, err = f.svc.Update(ctx, n.ID, nodes.Patch{Address: &bad})
	wantCode(t, err, apierr.InvalidRequest, 400)
	taken := "gpu-9"
	_, err = f.svc.Update(ctx, n.ID, nodes.Patch{Name: &taken})
	wantCode(t, err, apierr.NodeAlreadyExists, 409)
	addr, region := "gpu-1.dc1.example.com", "eu-west-1"
	f.svc.Prober.Resolver = fixedResolver{"gpu-1.dc1.example.com": "10.0.0.11"}
	up, err := f.svc.Update(ctx, n.ID, nodes.Patch{Address: &addr, Region: &region})
	if err != nil || up.Address != addr || *up.Region != region || audits() != 1 {
		t.Fatalf("update: %+v %v", up.Node, err)
	}

	// Probe now.
	if _, res, err := f.svc.Probe(ctx, n.ID); err != nil || !res.Reachable || res.Addr.String() != "10.0.0.11:22" {
		t.Fatalf("probe: %+v %v", res, err)
	}

	// Delete: an online schedulable node is refused; cordoned it goes, with its tunnel.
	if err := f.svc.NodeStatus(ctx, n.ID, true, t0); err != nil {
		t.Fatal(err)
	}
	wantCode(t, f.svc.Delete(ctx, n.ID), apierr.NodeInUse, 409)
	f.svc.Allocations = heldGPUs{n.ID: {"GPU-0"}}
	if _, err := f.svc.ChangeSchedule(ctx, n.ID, nodes.ActionCordon); err != nil {
		t.Fatal(err)
	}
	wantCode(t, f.svc.Delete(ctx, n.ID), apierr.NodeInUse, 409)
	f.svc.Allocations = nodes.NoAllocations{}
	if err := f.svc.Delete(ctx, n.ID); err != nil {
		t.Fatal(err)
	}
	if f.disc.count() != 1 || f.count(t, `SELECT count(*) FROM nodes WHERE id = $1`, n.ID) != 0 {
		t.Fatal("delete did not remove the node and end its tunnel")
	}
	wantCode(t, f.svc.Delete(ctx, n.ID), apierr.NodeNotFound, 404)
	_, err = f.svc.Get(ctx, n.ID)
	wantCode(t, err, apierr.NodeNotFound, 404)
}

type fixedResolver map[string]string

func (r fixedResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	a, ok := r[host]
	if !ok {
		return nil, errors.New("no such host")
	}
	return []netip.Addr{netip.MustParseAddr(a)}, nil
}
