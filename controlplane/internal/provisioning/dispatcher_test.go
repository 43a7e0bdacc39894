package provisioning_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/gantry-gpu/gantry/controlplane/internal/allocations"
	"github.com/gantry-gpu/gantry/controlplane/internal/provisioning"
	"github.com/gantry-gpu/gantry/proto/api"
	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
	"github.com/gantry-gpu/gantry/shared/alloctask"
)

const (
	accepted  = fabricv1.TaskAckStatus_TASK_ACK_STATUS_ACCEPTED
	duplicate = fabricv1.TaskAckStatus_TASK_ACK_STATUS_DUPLICATE
	rejected  = fabricv1.TaskAckStatus_TASK_ACK_STATUS_REJECTED
)

func (w *world) report(t *testing.T, node uuid.UUID, task uuid.UUID, result string) {
	t.Helper()
	if err := w.App.Allocations.TaskResult(w.ctx, node, &fabricv1.TaskResult{
		TaskId: task.String(), Status: fabricv1.TaskResultStatus_TASK_RESULT_STATUS_SUCCEEDED, Result: []byte(result),
	}); err != nil {
		t.Fatalf("report %s: %v", task, err)
	}
}

// events are the allocation's status events as "event/actor".
func (w *world) events(t *testing.T, id uuid.UUID) []string {
	t.Helper()
	rows, err := w.Pool.Query(w.ctx, `SELECT event, actor_type FROM allocation_events WHERE allocation_id = $1 ORDER BY created_at, id`, id)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var ev, actor string
		if err := rows.Scan(&ev, &actor); err != nil {
			t.Fatal(err)
		}
		out = append(out, ev+"/"+actor)
	}
	return out
}

func (w *world) heldGPUs(t *testing.T, id uuid.UUID) int {
	return w.count(t, `SELECT count(*) FROM allocation_gpus WHERE allocation_id = $1 AND released_at IS NULL`, id)
}

func equal(a, b []string) bool {
	return strings.Join(a, ",") == strings.Join(b, ",")
}

// The whole way: create → the task reaches the agent through the outbox, the stream and
// the fabric → provisioning (acked only once the agent acked) → the agent's report →
// active; release → the release task reaches the agent → released on its report.
func TestProvisionAndReleaseThroughTheAgent(t *testing.T) {
	w := newWorld(t)
	node, tok := w.enroll(t, "gpu-a")
	agent := w.agent(t, node, tok, 2)
	w.relay(t)
	d, reg := w.dispatcher(t)

	a := w.create(t, "train", "corr-provision-1")
	if a.Status != "requested" || a.NodeID != node {
		t.Fatalf("created: %+v", a)
	}
	w.waitStatus(t, a.ID, "provisioning")
	prov := w.task(t, a.ID, alloctask.KindProvision)
	if prov.AckedAt == nil || prov.Attempts != 1 || prov.Finished != nil || prov.LastError != nil {
		t.Fatalf("provision task after the ack: %+v", prov)
	}
	tasks, acks := agent.received()
	if len(tasks) != 1 || len(acks) != 1 || acks[0] != accepted {
		t.Fatalf("agent received %d tasks, acks %v", len(tasks), acks)
	}
	got := tasks[0]
	if got.GetTaskId() != prov.ID.String() || got.GetKind() != alloctask.KindProvision || got.GetContentType() != "application/json" ||
		got.GetAttempt() != 1 || got.GetCorrelationId() != "corr-provision-1" || got.GetTraceparent() == "" ||
		!got.GetDeadline().AsTime().Equal(prov.CreatedAt.Add(timeout)) {
		t.Fatalf("dispatched task: %v (task row %+v)", got, prov)
	}
	var p alloctask.Payload
	if err := json.Unmarshal(got.GetPayload(), &p); err != nil {
		t.Fatal(err)
	}
	want := alloctask.Payload{
		AllocationID: a.ID.String(), TenantID: w.Acme.ID.String(), ProjectID: w.Acme.DefaultProject.String(),
		User: alloctask.UserName(a.ID.String()), GPUs: []alloctask.GPU{{UUID: "GPU-" + node.String()[:8] + "-0", Index: 0}},
		SSHPublicKeys: []string{w.Key},
	}
	if b1, b2 := mustJSON(t, p), mustJSON(t, want); b1 != b2 || p.Validate() != nil {
		t.Fatalf("payload %s, want %s (%v)", b1, b2, p.Validate())
	}
	if ev := w.events(t, a.ID); !equal(ev, []string{"create/user", "provision_started/system"}) {
		t.Fatalf("events: %v", ev)
	}
	if n := w.count(t, `SELECT count(*) FROM allocation_events WHERE allocation_id = $1 AND event = 'provision_started' AND correlation_id = 'corr-provision-1'`, a.ID); n != 1 {
		t.Fatalf("provision_started does not carry the create's correlation id: %d", n)
	}

	w.report(t, node, prov.ID, `{"host":"10.9.0.1","port":22,"user":"`+p.User+`"}`)
	if got := w.get(t, a.ID); got.Status != "active" || got.Connection == nil || got.Connection.User != p.User {
		t.Fatalf("active: %+v", got)
	}

	rel, err := w.Alice.ReleaseAllocationWithResponse(w.ctx, a.ID, &api.ReleaseAllocationParams{XProjectID: w.Acme.DefaultProject})
	if err != nil || rel.StatusCode() != 200 || rel.JSON200.Status != "releasing" {
		t.Fatalf("release: %v %s", err, rel.Body)
	}
	var relTask taskRow
	eventually(t, "release task acknowledged", func() bool {
		relTask = w.task(t, a.ID, alloctask.KindRelease)
		return relTask.AckedAt != nil
	})
	tasks, acks = agent.received()
	if len(tasks) != 2 || tasks[1].GetTaskId() != relTask.ID.String() || tasks[1].GetKind() != alloctask.KindRelease || acks[1] != accepted {
		t.Fatalf("agent received %v / %v", tasks, acks)
	}
	if got := w.get(t, a.ID); got.Status != "releasing" {
		t.Fatalf("the release ack moved the allocation: %s", got.Status)
	}
	w.report(t, node, relTask.ID, "")
	if got := w.get(t, a.ID); got.Status != "released" || w.heldGPUs(t, a.ID) != 0 {
		t.Fatalf("released: %+v, %d GPUs held", got, w.heldGPUs(t, a.ID))
	}

	// Metrics: two acknowledgements observed, nothing timed out or refused, the queue empty.
	w.drained(t)
	if err := d.RefreshDepth(w.ctx); err != nil {
		t.Fatal(err)
	}
	m := d.Metrics()
	if n := testutil.CollectAndCount(m.DispatchLatency); n != 1 {
		t.Fatalf("latency series: %d", n)
	}
	if c := histogramCount(t, reg, "provisioning_dispatch_latency_seconds"); c != 2 {
		t.Fatalf("latency observations: %d", c)
	}
	if v := testutil.ToFloat64(m.Timeouts) + testutil.ToFloat64(m.Failures) + testutil.ToFloat64(m.QueueDepth); v != 0 {
		t.Fatalf("timeouts + failures + depth = %v", v)
	}
	if v := testutil.ToFloat64(m.ConsumerLag.WithLabelValues(d.Config().Stream)); v != 0 {
		t.Fatalf("lag %v", v)
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func histogramCount(t *testing.T, reg *prometheus.Registry, name string) uint64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetHistogram().GetSampleCount()
		}
	}
	t.Fatalf("%s not gathered", name)
	return 0
}

// A node nobody holds a tunnel to: the task is retried with backoff (attempts and the
// cause recorded), and once the provisioning timeout has passed the allocation fails:
// reason recorded, GPUs freed, provisioning.failed emitted, the timeout counted.
func TestOfflineNodeTimesOutAndFailsTheAllocation(t *testing.T) {
	w := newWorld(t)
	node := w.offlineNode(t, "dark")
	w.relay(t)
	d, _ := w.dispatcher(t)

	a := w.create(t, "train", "corr-offline-1")
	eventually(t, "three delivery attempts", func() bool {
		return w.task(t, a.ID, alloctask.KindProvision).Attempts >= 3
	})
	prov := w.task(t, a.ID, alloctask.KindProvision)
	if prov.LastError == nil || !strings.HasPrefix(*prov.LastError, "node_offline: ") || prov.AckedAt != nil || prov.Finished != nil {
		t.Fatalf("retried task: %+v", prov)
	}
	if got := w.get(t, a.ID); got.Status != "requested" || w.heldGPUs(t, a.ID) != 1 {
		t.Fatalf("before the deadline: %s, %d GPUs", got.Status, w.heldGPUs(t, a.ID))
	}
	if v := testutil.ToFloat64(d.Metrics().Timeouts); v != 0 {
		t.Fatalf("timeouts before the deadline: %v", v)
	}

	w.Clock.Set(prov.CreatedAt.Add(timeout))
	got := w.waitStatus(t, a.ID, "failed")
	const reason = "provisioning_timeout: node did not acknowledge within 10m"
	if got.StatusReason == nil || *got.StatusReason != reason || got.EndedAt == nil {
		t.Fatalf("failed: %+v", got)
	}
	if n := w.heldGPUs(t, a.ID); n != 0 {
		t.Fatalf("GPUs still held: %d", n)
	}
	prov = w.task(t, a.ID, alloctask.KindProvision)
	if prov.Finished == nil || prov.LastError == nil || *prov.LastError != reason || prov.AckedAt != nil {
		t.Fatalf("timed-out task: %+v", prov)
	}
	if ev := w.events(t, a.ID); !equal(ev, []string{"create/user", "provision_failed/system"}) {
		t.Fatalf("events: %v", ev)
	}
	var payload map[string]any
	if err := w.Pool.QueryRow(w.ctx, `SELECT payload FROM outbox_events WHERE event_type = 'provisioning.failed'`).Scan(&payload); err != nil {
		t.Fatalf("provisioning.failed: %v", err)
	}
	if payload["allocation_id"] != a.ID.String() || payload["task_id"] != prov.ID.String() || payload["node_id"] != node.String() ||
		payload["reason_code"] != allocations.ReasonProvisioningTimeout || payload["reason"] != reason {
		t.Fatalf("provisioning.failed payload: %v", payload)
	}
	if n := w.count(t, `SELECT count(*) FROM outbox_events WHERE event_type = 'provisioning.failed' AND headers->>'x-correlation-id' = 'corr-offline-1'`); n != 1 {
		t.Fatalf("provisioning.failed does not carry the correlation id: %d", n)
	}
	if n := w.count(t, `SELECT count(*) FROM audit_events WHERE action = 'allocation.provision_failed' AND target_id = $1 AND actor_type = 'system'`, a.ID.String()); n != 1 {
		t.Fatalf("audit rows: %d", n)
	}
	w.drained(t)
	if v := testutil.ToFloat64(d.Metrics().Timeouts); v != 1 {
		t.Fatalf("provisioning_timeouts_total %v", v)
	}
	if v := testutil.ToFloat64(d.Metrics().Failures); v != 0 {
		t.Fatalf("provisioning_failures_total %v", v)
	}
	// The GPU is free again: the next launch gets it.
	if b := w.create(t, "again", ""); b.NodeID != node {
		t.Fatalf("placed on %s", b.NodeID)
	}
}

// The agent refuses the task: the allocation fails with the agent's code and message,
// GPUs freed, provisioning.failed emitted, the failure counted; nothing is retried.
func TestAgentRefusalFailsTheAllocation(t *testing.T) {
	w := newWorld(t)
	node, tok := w.enroll(t, "gpu-r")
	agent := w.agent(t, node, tok, 1)
	agent.mu.Lock()
	agent.refuse = alloctask.CodeGPUUnavailable
	agent.mu.Unlock()
	w.relay(t)
	d, _ := w.dispatcher(t)

	a := w.create(t, "train", "")
	got := w.waitStatus(t, a.ID, "failed")
	if got.StatusReason == nil || *got.StatusReason != "gpu_unavailable: GPU 0 is held by another workload" {
		t.Fatalf("failed: %+v", got)
	}
	w.drained(t)
	if _, acks := agent.received(); len(acks) != 1 || acks[0] != rejected {
		t.Fatalf("acks %v", acks)
	}
	if n := w.heldGPUs(t, a.ID); n != 0 {
		t.Fatalf("GPUs held: %d", n)
	}
	prov := w.task(t, a.ID, alloctask.KindProvision)
	if prov.Finished == nil || prov.AckedAt != nil || prov.LastError == nil || *prov.LastError != *got.StatusReason {
		t.Fatalf("refused task: %+v", prov)
	}
	if n := w.count(t, `SELECT count(*) FROM outbox_events WHERE event_type = 'provisioning.failed' AND payload->>'reason_code' = 'gpu_unavailable'`); n != 1 {
		t.Fatalf("provisioning.failed events: %d", n)
	}
	if v := testutil.ToFloat64(d.Metrics().Failures); v != 1 {
		t.Fatalf("provisioning_failures_total %v", v)
	}
	if v := testutil.ToFloat64(d.Metrics().Timeouts); v != 0 {
		t.Fatalf("provisioning_timeouts_total %v", v)
	}
}

// A replica delivered the task and died before recording the agent's ack: the
// redelivery gets DUPLICATE from the agent, which counts as the ack (provisioning once).
// A message redelivered after the ack was recorded sends nothing and moves nothing.
func TestRedeliveryIsNotDeliveredTwice(t *testing.T) {
	w := newWorld(t)
	node, tok := w.enroll(t, "gpu-d")
	agent := w.agent(t, node, tok, 1)
	a := w.create(t, "train", "")
	prov := w.task(t, a.ID, alloctask.KindProvision)

	// The replica that died: the agent took the task, nothing was recorded.
	ack, err := w.App.Fabric.Dispatch(w.ctx, node, &fabricv1.TaskDispatch{TaskId: prov.ID.String(), Kind: alloctask.KindProvision})
	if err != nil || ack.GetStatus() != accepted {
		t.Fatalf("first delivery: %v %v", ack, err)
	}
	w.relay(t)
	d, _ := w.dispatcher(t)
	w.waitStatus(t, a.ID, "provisioning")
	w.drained(t)
	if _, acks := agent.received(); len(acks) != 2 || acks[1] != duplicate {
		t.Fatalf("acks %v", acks)
	}
	if ev := w.events(t, a.ID); !equal(ev, []string{"create/user", "provision_started/system"}) {
		t.Fatalf("events: %v", ev)
	}
	if c := histogramCount(t, prometheusRegistry(t, d), "provisioning_dispatch_latency_seconds"); c != 1 {
		t.Fatalf("latency observations: %d", c)
	}

	// The same message again (a lost JetStream ack): acknowledged without a delivery.
	events, audits := w.count(t, `SELECT count(*) FROM allocation_events`), w.count(t, `SELECT count(*) FROM audit_events`)
	ackedAt := *w.task(t, a.ID, alloctask.KindProvision).AckedAt
	w.publish(t, []byte(`{"task_id":"`+prov.ID.String()+`","allocation_id":"`+a.ID.String()+`","node_id":"`+node.String()+`","task_kind":"allocation.provision"}`))
	w.drained(t)
	if tasks, _ := agent.received(); len(tasks) != 2 {
		t.Fatalf("the acknowledged task was delivered again: %d deliveries", len(tasks))
	}
	if e2, a2 := w.count(t, `SELECT count(*) FROM allocation_events`), w.count(t, `SELECT count(*) FROM audit_events`); e2 != events || a2 != audits {
		t.Fatalf("the redelivery wrote events %d -> %d, audit %d -> %d", events, e2, audits, a2)
	}
	if got := w.task(t, a.ID, alloctask.KindProvision); got.AckedAt == nil || !got.AckedAt.Equal(ackedAt) || got.Attempts != 1 {
		t.Fatalf("task: %+v", got)
	}

	// Junk and unknown tasks are dropped, not retried forever.
	w.publish(t, []byte(`not json`))
	w.publish(t, []byte(`{"task_id":"`+uuid.NewString()+`"}`))
	w.drained(t)
	if tasks, _ := agent.received(); len(tasks) != 2 {
		t.Fatalf("deliveries: %d", len(tasks))
	}
}

// prometheusRegistry gathers d's metrics on a registry of their own.
func prometheusRegistry(t *testing.T, d *provisioning.Dispatcher) *prometheus.Registry {
	t.Helper()
	reg := prometheus.NewRegistry()
	m := d.Metrics()
	reg.MustRegister(m.QueueDepth, m.DispatchLatency, m.Timeouts, m.Failures, m.ConsumerLag)
	return reg
}

// Release on a node that went away: retried until the deadline, then release_failed
// with the reason and provisioning.release_failed (billing stopped, GPUs kept); the
// user's retry sends a new release task, which the returning agent gets.
func TestReleaseTimeoutThenRetry(t *testing.T) {
	w := newWorld(t)
	node, tok := w.enroll(t, "gpu-t")
	agent := w.agent(t, node, tok, 1)
	w.relay(t)
	d, _ := w.dispatcher(t)

	a := w.create(t, "train", "")
	w.waitStatus(t, a.ID, "provisioning")
	w.report(t, node, w.task(t, a.ID, alloctask.KindProvision).ID, `{"host":"10.9.0.1","port":22,"user":"u"}`)
	w.disconnect(t, agent)

	rel, err := w.Alice.ReleaseAllocationWithResponse(w.ctx, a.ID, &api.ReleaseAllocationParams{XProjectID: w.Acme.DefaultProject})
	if err != nil || rel.StatusCode() != 200 || rel.JSON200.Status != "releasing" {
		t.Fatalf("release: %v %s", err, rel.Body)
	}
	eventually(t, "release retried", func() bool { return w.task(t, a.ID, alloctask.KindRelease).Attempts >= 2 })
	first := w.task(t, a.ID, alloctask.KindRelease)
	w.Clock.Set(first.CreatedAt.Add(timeout + time.Second))
	got := w.waitStatus(t, a.ID, "release_failed")
	const reason = "release_timeout: node did not acknowledge within 10m"
	if got.StatusReason == nil || *got.StatusReason != reason {
		t.Fatalf("release_failed: %+v", got)
	}
	if n := w.heldGPUs(t, a.ID); n != 1 {
		t.Fatalf("release_failed keeps the GPU: %d", n)
	}
	if n := w.count(t, `SELECT count(*) FROM billing_usage_records WHERE source = 'allocation' AND source_id = $1 AND bill_to IS NULL`, a.ID); n != 0 {
		t.Fatalf("release_failed stops billing: %d open", n)
	}
	if n := w.count(t, `SELECT count(*) FROM outbox_events WHERE event_type = 'provisioning.release_failed' AND payload->>'allocation_id' = $1 AND payload->>'reason' = $2`, a.ID.String(), reason); n != 1 {
		t.Fatalf("provisioning.release_failed events: %d", n)
	}
	w.drained(t)
	if v := testutil.ToFloat64(d.Metrics().Timeouts); v != 1 {
		t.Fatalf("provisioning_timeouts_total %v", v)
	}

	// Retry with the agent back.
	w.Clock.Set(time.Now())
	agent2 := w.agent(t, node, tok, 1)
	rel, err = w.Alice.ReleaseAllocationWithResponse(w.ctx, a.ID, &api.ReleaseAllocationParams{XProjectID: w.Acme.DefaultProject})
	if err != nil || rel.StatusCode() != 200 || rel.JSON200.Status != "releasing" {
		t.Fatalf("retry: %v %s", err, rel.Body)
	}
	var second taskRow
	eventually(t, "second release task acknowledged", func() bool {
		second = w.task(t, a.ID, alloctask.KindRelease)
		return second.ID != first.ID && second.AckedAt != nil
	})
	if tasks, _ := agent2.received(); len(tasks) != 1 || tasks[0].GetTaskId() != second.ID.String() {
		t.Fatalf("returning agent received %v", tasks)
	}
	w.report(t, node, second.ID, "")
	if got := w.get(t, a.ID); got.Status != "released" || w.heldGPUs(t, a.ID) != 0 {
		t.Fatalf("released: %+v", got)
	}
}

// Replicas share the durable consumer: every task is delivered once, by one of them.
func TestReplicasShareTheWork(t *testing.T) {
	w := newWorld(t)
	node, tok := w.enroll(t, "gpu-m")
	agent := w.agent(t, node, tok, 8)
	d1, _ := w.dispatcher(t)
	d2, _ := w.dispatcher(t)
	var ids []uuid.UUID
	for i := 0; i < 8; i++ {
		ids = append(ids, w.create(t, "m", "").ID)
	}
	w.relay(t)
	for _, id := range ids {
		w.waitStatus(t, id, "provisioning")
	}
	w.drained(t)
	tasks, acks := agent.received()
	seen := map[string]bool{}
	for i, tk := range tasks {
		if seen[tk.GetTaskId()] || acks[i] != accepted {
			t.Fatalf("task %s delivered twice (%v)", tk.GetTaskId(), acks)
		}
		seen[tk.GetTaskId()] = true
	}
	if len(tasks) != len(ids) {
		t.Fatalf("%d deliveries for %d tasks", len(tasks), len(ids))
	}
	c1 := histogramCount(t, prometheusRegistry(t, d1), "provisioning_dispatch_latency_seconds")
	c2 := histogramCount(t, prometheusRegistry(t, d2), "provisioning_dispatch_latency_seconds")
	if c1+c2 != uint64(len(ids)) {
		t.Fatalf("acks observed %d + %d", c1, c2)
	}
}

// While messages wait (no dispatcher running), the queue metrics show them; the app
// registers the metrics on its own registry under the contract's names, lint-clean.
func TestQueueMetrics(t *testing.T) {
	w := newWorld(t)
	w.offlineNode(t, "n1")
	w.offlineNode(t, "n2")
	w.create(t, "a", "")
	w.create(t, "b", "")
	if _, err := w.App.Relay.Drain(w.ctx); err != nil {
		t.Fatal(err)
	}
	d := w.App.Provisioning
	if _, err := d.EnsureConsumer(w.ctx); err != nil {
		t.Fatal(err)
	}
	if err := d.RefreshDepth(w.ctx); err != nil {
		t.Fatal(err)
	}
	if v := testutil.ToFloat64(d.Metrics().QueueDepth); v != 2 {
		t.Fatalf("provisioning_queue_depth %v", v)
	}
	if v := testutil.ToFloat64(d.Metrics().ConsumerLag.WithLabelValues(d.Config().Stream)); v != 2 {
		t.Fatalf("nats_consumer_lag %v", v)
	}
	problems, err := testutil.GatherAndLint(w.App.Metrics.Registry,
		"provisioning_queue_depth", "provisioning_dispatch_latency_seconds", "provisioning_timeouts_total",
		"provisioning_failures_total", "nats_consumer_lag")
	if err != nil || len(problems) != 0 {
		t.Fatalf("lint: %v %v", err, problems)
	}
	mfs, err := w.App.Metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := map[string]bool{}
	for _, mf := range mfs {
		found[mf.GetName()] = true
	}
	for _, name := range []string{"provisioning_queue_depth", "provisioning_dispatch_latency_seconds", "provisioning_timeouts_total", "provisioning_failures_total", "nats_consumer_lag"} {
		if !found[name] {
			t.Errorf("%s not on the app's registry", name)
		}
	}
}

// A consumer deleted under the running dispatcher (an operator, a stream reset) is
// created again, and work goes on.
func TestConsumerRecreatedAfterDeletion(t *testing.T) {
	w := newWorld(t)
	node, tok := w.enroll(t, "gpu-c")
	w.agent(t, node, tok, 2)
	w.relay(t)
	d, _ := w.dispatcher(t)
	w.waitStatus(t, w.create(t, "one", "").ID, "provisioning")

	cfg := d.Config()
	if err := w.App.JS.DeleteConsumer(w.ctx, cfg.Stream, cfg.Consumer); err != nil {
		t.Fatal(err)
	}
	w.waitStatus(t, w.create(t, "two", "").ID, "provisioning")
}
