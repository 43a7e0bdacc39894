package agent_test

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/gantry-gpu/gantry/nodeagent/agent"
	"github.com/gantry-gpu/gantry/nodeagent/logship"
	"github.com/gantry-gpu/gantry/nodeagent/tasks"
	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
	"github.com/gantry-gpu/gantry/shared/fabricnet"
)

// scrapeThroughTunnel opens a METRICS stream the way the control plane does and parses
// what the agent answers.
func scrapeThroughTunnel(t *testing.T, p *peer) map[string]*dto.MetricFamily {
	t.Helper()
	p.mu.Lock()
	s := p.sessions[len(p.sessions)-1]
	p.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := fabricnet.OpenRaw(ctx, s, &fabricv1.StreamPreamble{Kind: fabricv1.StreamKind_STREAM_KIND_METRICS, StreamId: "scrape-1"})
	if err != nil {
		t.Fatalf("open metrics stream: %v", err)
	}
	defer st.Close()
	_ = st.SetReadDeadline(time.Now().Add(10 * time.Second))
	body, err := io.ReadAll(io.LimitReader(st, agent.MaxMetricsBytes+1))
	if err != nil {
		t.Fatalf("read exposition: %v", err)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := parser.TextToMetricFamilies(strings.NewReader(string(body)))
	if err != nil {
		t.Fatalf("parse exposition: %v\n%s", err, body)
	}
	return mfs
}

func value(t *testing.T, mfs map[string]*dto.MetricFamily, name string, labels map[string]string) float64 {
	t.Helper()
	mf, ok := mfs[name]
	if !ok {
		t.Fatalf("metric %s missing", name)
	}
next:
	for _, m := range mf.GetMetric() {
		for k, v := range labels {
			found := false
			for _, lp := range m.GetLabel() {
				if lp.GetName() == k && lp.GetValue() == v {
					found = true
				}
			}
			if !found {
				continue next
			}
		}
		switch {
		case m.GetGauge() != nil:
			return m.GetGauge().GetValue()
		case m.GetCounter() != nil:
			return m.GetCounter().GetValue()
		}
	}
	t.Fatalf("metric %s%v missing", name, labels)
	return 0
}

func TestMetricsServedThroughTheTunnel(t *testing.T) {
	p := newPeer(t, nil)
	mux := tasks.NewMux()
	mux.Handle("test.echo", tasks.ExecutorFunc(func(context.Context, tasks.Task) tasks.Result { return tasks.Result{Status: tasks.Succeeded} }))
	mux.Handle("test.fail", tasks.ExecutorFunc(func(context.Context, tasks.Task) tasks.Result {
		return tasks.Fail("gpu_unavailable", errors.New("gone"))
	}))
	logStats := logship.Stats{Sent: 40, SentBatches: 4, DroppedQueueFull: 3, DroppedRejected: 1}
	r := startAgent(t, p, fabricnet.ModeQUIC, func(o *agent.Options) {
		o.Executor = mux
		o.AgentVersion, o.AgentCommit = "1.4.2", "abc1234"
		o.LogStats = func() logship.Stats { return logStats }
	})
	p.waitFor("telemetry", func() bool { return p.ctl != nil && p.countLocked(isTelemetry) >= 1 })
	p.send(dispatch("m1", "test.echo"))
	p.send(dispatch("m2", "test.fail"))
	p.send(dispatch("m3", "test.nope"))
	p.waitFor("results and rejection", func() bool {
		return len(results(p, "m1")) == 1 && len(results(p, "m2")) == 1 && len(acks(p, "m3")) == 1
	})

	mfs := scrapeThroughTunnel(t, p)
	if v := value(t, mfs, "gantry_nodeagent_build_info", map[string]string{"version": "1.4.2", "commit": "abc1234"}); v != 1 {
		t.Fatalf("build info = %v", v)
	}
	if v := value(t, mfs, "gantry_nodeagent_tunnel_connected", map[string]string{"transport": "quic"}); v != 1 {
		t.Fatalf("tunnel_connected{quic} = %v", v)
	}
	if v := value(t, mfs, "gantry_nodeagent_tunnel_sessions_total", nil); v != 1 {
		t.Fatalf("sessions = %v", v)
	}
	for _, c := range []struct {
		kind, outcome string
	}{{"test.echo", "succeeded"}, {"test.fail", "failed"}, {"unsupported", "rejected"}} {
		if v := value(t, mfs, "gantry_nodeagent_tasks_total", map[string]string{"kind": c.kind, "outcome": c.outcome}); v != 1 {
			t.Fatalf("tasks_total{%s,%s} = %v", c.kind, c.outcome, v)
		}
	}
	inv, err := r.mock.Inventory(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if v := value(t, mfs, "gantry_nodeagent_gpus", nil); int(v) != len(inv.GPUs) || v == 0 {
		t.Fatalf("gpus = %v, inventory has %d", v, len(inv.GPUs))
	}
	g := inv.GPUs[0]
	lbl := map[string]string{"gpu_uuid": g.UUID, "model": g.Model}
	if v := value(t, mfs, "gantry_nodeagent_gpu_memory_total_bytes", lbl); v != float64(g.MemoryBytes) {
		t.Fatalf("memory_total = %v, want %d", v, g.MemoryBytes)
	}
	for _, name := range []string{"gantry_nodeagent_gpu_utilization_percent", "gantry_nodeagent_gpu_memory_used_bytes", "gantry_nodeagent_gpu_temperature_celsius", "gantry_nodeagent_gpu_healthy"} {
		value(t, mfs, name, lbl)
	}
	if v := value(t, mfs, "gantry_nodeagent_gpu_temperature_celsius", lbl); v <= 0 {
		t.Fatalf("temperature = %v: the mock reports a positive temperature", v)
	}
	if v := value(t, mfs, "gantry_nodeagent_log_batches_sent_total", nil); v != 4 {
		t.Fatalf("log batches = %v", v)
	}
	if v := value(t, mfs, "gantry_nodeagent_log_events_dropped_total", map[string]string{"reason": "queue_full"}); v != 3 {
		t.Fatalf("dropped queue_full = %v", v)
	}
	if _, ok := mfs["go_goroutines"]; !ok {
		t.Fatal("Go runtime metrics missing")
	}

	// After a cut the reconnect is counted and the new tunnel serves the scrape.
	p.cut()
	p.waitFor("second session", func() bool { return len(p.sessions) == 1 && r.a.Status().Sessions == 2 && r.a.Status().Connected })
	mfs = scrapeThroughTunnel(t, p)
	if v := value(t, mfs, "gantry_nodeagent_tunnel_reconnects_total", nil); v < 1 {
		t.Fatalf("reconnects = %v after a cut", v)
	}
	if v := value(t, mfs, "gantry_nodeagent_tunnel_sessions_total", nil); v != 2 {
		t.Fatalf("sessions = %v after a reconnect", v)
	}
}
