package reports_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/apps/reports"
	"github.com/gantry-gpu/gantry/proto/fabric/apptask"
	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
)

// recorder is an Applier that keeps what it was given, in order.
type recorder struct {
	mu   sync.Mutex
	got  []got
	fail error
}

type got struct {
	node uuid.UUID
	rep  *fabricv1.ControllerReport
}

func (r *recorder) ApplyControllerReport(_ context.Context, nodeID uuid.UUID, rep *fabricv1.ControllerReport) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fail != nil {
		return r.fail
	}
	r.got = append(r.got, got{nodeID, rep})
	return nil
}

func (r *recorder) all() []got {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]got(nil), r.got...)
}

func appReport(state string) *fabricv1.ControllerReport {
	return &fabricv1.ControllerReport{
		Controller: apptask.Controller, ObjectId: uuid.NewString(), State: state, Generation: 1,
		AppInstance: &fabricv1.AppInstanceStatus{AllocationId: uuid.NewString(), Port: 8888},
	}
}

// TestValidateEdges: each limit passes at its edge and fails one past it.
func TestValidateEdges(t *testing.T) {
	for name, c := range map[string]struct {
		mut func(*fabricv1.ControllerReport)
		ok  bool
	}{
		"valid":                {func(*fabricv1.ControllerReport) {}, true},
		"unknown app state":    {func(r *fabricv1.ControllerReport) { r.State = "exploded" }, false},
		"empty state":          {func(r *fabricv1.ControllerReport) { r.State = "" }, false},
		"no status":            {func(r *fabricv1.ControllerReport) { r.AppInstance = nil }, false},
		"object id not uuid":   {func(r *fabricv1.ControllerReport) { r.ObjectId = "x" }, false},
		"controller uppercase": {func(r *fabricv1.ControllerReport) { r.Controller = "App" }, false},
		"controller 64 bytes":  {func(r *fabricv1.ControllerReport) { r.Controller = strings.Repeat("a", 64); r.State = "any" }, true},
		"controller 65 bytes":  {func(r *fabricv1.ControllerReport) { r.Controller = strings.Repeat("a", 65); r.State = "any" }, false},
		"message at limit":     {func(r *fabricv1.ControllerReport) { r.Message = strings.Repeat("m", apptask.MaxMessageBytes) }, true},
		"message past limit":   {func(r *fabricv1.ControllerReport) { r.Message = strings.Repeat("m", apptask.MaxMessageBytes+1) }, false},
		"message not utf8":     {func(r *fabricv1.ControllerReport) { r.Message = "\xff" }, false},
		"details at limit":     {func(r *fabricv1.ControllerReport) { r.DetailsJson = make([]byte, reports.MaxDetailsBytes) }, true},
		"details past limit":   {func(r *fabricv1.ControllerReport) { r.DetailsJson = make([]byte, reports.MaxDetailsBytes+1) }, false},
		"state past limit": {func(r *fabricv1.ControllerReport) {
			r.Controller = "other"
			r.State = strings.Repeat("s", reports.MaxStateBytes+1)
		}, false},
		"allocation not uuid": {func(r *fabricv1.ControllerReport) { r.AppInstance.AllocationId = "nope" }, false},
		"port past 65535":     {func(r *fabricv1.ControllerReport) { r.AppInstance.Port = 65536 }, false},
		"other controller free": {func(r *fabricv1.ControllerReport) {
			r.Controller = "shared_runtime_worker"
			r.AppInstance = nil
			r.State = "serving"
		}, true},
	} {
		r := appReport(apptask.StateRunning)
		c.mut(r)
		if err := reports.Validate(r); (err == nil) != c.ok {
			t.Errorf("%s: err %v, want ok %v", name, err, c.ok)
		} else if err != nil && !errors.Is(err, reports.ErrInvalid) {
			t.Errorf("%s: %v is not ErrInvalid", name, err)
		}
	}
	for _, s := range apptask.States {
		if err := reports.Validate(appReport(s)); err != nil {
			t.Errorf("state %s: %v", s, err)
		}
	}
}

// TestRouting: a valid report reaches its controller's applier with the node id; an
// invalid one, one of an unknown controller and one the applier refuses are dropped
// and counted.
func TestRouting(t *testing.T) {
	r := reports.New(nil)
	apps, other := &recorder{}, &recorder{}
	r.Handle(apptask.Controller, apps)
	r.Handle("shared_runtime_worker", other)
	node := uuid.New()

	rep := appReport(apptask.StateStarting)
	r.OnControllerReport(context.Background(), node, rep)
	w := &fabricv1.ControllerReport{Controller: "shared_runtime_worker", ObjectId: uuid.NewString(), State: "serving"}
	if err := r.Apply(context.Background(), node, w); err != nil {
		t.Fatal(err)
	}
	if g := apps.all(); len(g) != 1 || g[0].node != node || g[0].rep != rep {
		t.Fatalf("apps got %+v", g)
	}
	if g := other.all(); len(g) != 1 || g[0].rep != w {
		t.Fatalf("other got %+v", g)
	}

	bad := appReport("exploded")
	if err := r.Apply(context.Background(), node, bad); !errors.Is(err, reports.ErrInvalid) {
		t.Fatalf("invalid: %v", err)
	}
	unknown := &fabricv1.ControllerReport{Controller: "gpu_reset", ObjectId: uuid.NewString(), State: "done"}
	if err := r.Apply(context.Background(), node, unknown); !errors.Is(err, reports.ErrUnknownController) {
		t.Fatalf("unknown controller: %v", err)
	}
	apps.mu.Lock()
	apps.fail = errors.New("database unavailable")
	apps.mu.Unlock()
	if err := r.Apply(context.Background(), node, appReport(apptask.StateRunning)); err == nil {
		t.Fatal("applier error not returned")
	}
	if len(apps.all()) != 1 {
		t.Fatalf("dropped reports reached the applier: %+v", apps.all())
	}
	want := map[string]uint64{reports.OutcomeApplied: 2, reports.OutcomeInvalid: 1, reports.OutcomeUnknownController: 1, reports.OutcomeFailed: 1}
	if got := r.Stats(); len(got) != len(want) || got[reports.OutcomeApplied] != 2 || got[reports.OutcomeInvalid] != 1 || got[reports.OutcomeUnknownController] != 1 || got[reports.OutcomeFailed] != 1 {
		t.Fatalf("stats %v, want %v", got, want)
	}
}
