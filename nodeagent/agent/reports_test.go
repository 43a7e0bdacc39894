package agent_test

import (
	"sync"
	"testing"
	"time"

	"github.com/gantry-gpu/gantry/nodeagent/agent"
	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
	"github.com/gantry-gpu/gantry/shared/fabricnet"
)

// reportSource is a controller with settable reports (the app supervisor's role).
type reportSource struct {
	mu       sync.Mutex
	reps     map[string]*fabricv1.ControllerReport
	changed  chan struct{}
	interval time.Duration
}

func newReportSource(interval time.Duration) *reportSource {
	return &reportSource{reps: map[string]*fabricv1.ControllerReport{}, changed: make(chan struct{}, 1), interval: interval}
}

func (s *reportSource) set(id, state string, gen uint64) {
	s.mu.Lock()
	s.reps[id] = &fabricv1.ControllerReport{Controller: "app_instance", ObjectId: id, State: state, Generation: gen}
	s.mu.Unlock()
	select {
	case s.changed <- struct{}{}:
	default:
	}
}

func (s *reportSource) Reports() []*fabricv1.ControllerReport {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*fabricv1.ControllerReport, 0, len(s.reps))
	for _, r := range s.reps {
		out = append(out, r)
	}
	return out
}
func (s *reportSource) Changed() <-chan struct{}      { return s.changed }
func (s *reportSource) ReportInterval() time.Duration { return s.interval }

// reportsOf counts the reports received about id, optionally only those in state.
func reportsOf(p *peer, id, state string) int {
	return p.countLocked(func(m *fabricv1.AgentMessage) bool {
		r := m.GetControllerReport()
		return r != nil && r.GetObjectId() == id && (state == "" || r.GetState() == state)
	})
}

// TestControllerReportsOnEveryTunnelAndOnChange: every report goes out on a new tunnel;
// a change sends only the changed report; after a reconnect all are sent again.
func TestControllerReportsOnEveryTunnelAndOnChange(t *testing.T) {
	p := newPeer(t, nil)
	src := newReportSource(time.Hour)
	src.set("a", "starting", 1)
	src.set("b", "running", 4)
	startAgent(t, p, fabricnet.ModeTCP, func(o *agent.Options) { o.Reports = src })
	p.waitFor("both reports", func() bool { return reportsOf(p, "a", "starting") == 1 && reportsOf(p, "b", "running") == 1 })

	src.set("a", "running", 2)
	p.waitFor("the change", func() bool { return reportsOf(p, "a", "running") == 1 })
	p.mu.Lock()
	if n := reportsOf(p, "b", ""); n != 1 {
		p.mu.Unlock()
		t.Fatalf("unchanged report b sent %d times", n)
	}
	p.mu.Unlock()

	p.cut()
	p.waitFor("all reports on the new tunnel", func() bool {
		return p.ctls == 2 && reportsOf(p, "a", "running") == 2 && reportsOf(p, "b", "running") == 2
	})
}

// TestControllerReportsRepeatEveryInterval: with nothing changing, the reports go out
// again every ReportInterval (a heartbeat per object).
func TestControllerReportsRepeatEveryInterval(t *testing.T) {
	p := newPeer(t, nil)
	src := newReportSource(50 * time.Millisecond)
	src.set("a", "running", 2)
	startAgent(t, p, fabricnet.ModeTCP, func(o *agent.Options) { o.Reports = src })
	p.waitFor("repeats", func() bool { return reportsOf(p, "a", "running") >= 3 })
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, m := range p.msgs {
		if r := m.GetControllerReport(); r != nil && r.GetGeneration() != 2 {
			t.Fatalf("a repeat changed the generation: %v", r)
		}
	}
}

// TestControllerMetrics: the agent's metrics count the objects its controllers manage
// by state, and the reports it sent.
func TestControllerMetrics(t *testing.T) {
	p := newPeer(t, nil)
	src := newReportSource(time.Hour)
	src.set("a", "running", 2)
	src.set("b", "running", 2)
	src.set("c", "failed", 3)
	startAgent(t, p, fabricnet.ModeTCP, func(o *agent.Options) { o.Reports = src })
	p.waitFor("the reports", func() bool { return reportsOf(p, "c", "failed") == 1 })
	mfs := scrapeThroughTunnel(t, p)
	if v := value(t, mfs, "gantry_nodeagent_controller_objects", map[string]string{"controller": "app_instance", "state": "running"}); v != 2 {
		t.Fatalf("running %v", v)
	}
	if v := value(t, mfs, "gantry_nodeagent_controller_objects", map[string]string{"controller": "app_instance", "state": "failed"}); v != 1 {
		t.Fatalf("failed %v", v)
	}
	if v := value(t, mfs, "gantry_nodeagent_controller_reports_sent_total", nil); v < 3 {
		t.Fatalf("reports sent %v", v)
	}
}
