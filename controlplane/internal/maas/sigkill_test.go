package maas_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/maas"
	"github.com/gantry-gpu/gantry/controlplane/internal/maas/maastest"
	"github.com/gantry-gpu/gantry/proto/api"
)

// replica is a control plane running as a child process (replica_test.go).
type replica struct {
	cmd    *exec.Cmd
	log    string
	exited chan struct{}
	err    error
}

// startReplica starts a control-plane replica over the fixture's database, NATS stream
// and MAAS site. River takes a killed replica's running job for lost after
// GANTRY_JOBS_RESCUE_STUCK_AFTER; a MAAS step attempt is bounded by
// GANTRY_MAAS_STEP_ATTEMPT_TIMEOUT, which the rescue must exceed.
func startReplica(t *testing.T, f *fixture, parkLog string, n int) *replica {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cfg := f.e.App.Config
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(),
		replicaEnv+"=1",
		parkLogEnv+"="+parkLog,
		// Room for the parked transactions (one connection each) beside the replica's
		// own work: the default pool (4 on two cores) would be exhausted by them.
		"DATABASE_URL="+withParam(f.e.Pool.Config().ConnString(), "pool_max_conns=40"),
		"NATS_URL="+cfg.NATSURL,
		"REDIS_URL=",
		"GANTRY_EVENTS_STREAM="+cfg.EventsStream,
		"GANTRY_EVENTS_SUBJECT_PREFIX="+cfg.EventsSubjectPrefix,
		"GANTRY_HTTP_ADDR=127.0.0.1:0",
		"GANTRY_FABRIC_ADDR=127.0.0.1:0",
		"GANTRY_STORAGE_DRIVER=fs",
		"GANTRY_STORAGE_FS_ROOT="+filepath.Join(dir, "blobs"),
		"GANTRY_LOG_LEVEL=warn",
		"GANTRY_MAAS_POLL_INTERVAL=50ms",
		"GANTRY_MAAS_SYNC_INTERVAL=1h",
		"GANTRY_MAAS_CONTROL_PLANE_URL=http://127.0.0.1:1",
		"GANTRY_MAAS_STEP_ATTEMPT_TIMEOUT=10s",
		"GANTRY_JOBS_JOB_TIMEOUT=10s",
		"GANTRY_JOBS_RESCUE_STUCK_AFTER=12s",
	)
	r := &replica{cmd: cmd, log: filepath.Join(dir, fmt.Sprintf("replica-%d.log", n)), exited: make(chan struct{})}
	out, err := os.Create(r.log)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	_ = out.Close()
	go func() { r.err = cmd.Wait(); close(r.exited) }()
	t.Cleanup(func() {
		select {
		case <-r.exited:
		default:
			// A parked replica never finishes its stop (its parked transaction holds a
			// connection the pool waits for): kill it.
			_ = cmd.Process.Signal(syscall.SIGKILL)
			<-r.exited
		}
		if t.Failed() {
			b, _ := os.ReadFile(r.log)
			t.Logf("replica %d log:\n%s", n, tail(string(b), 4000))
		}
	})
	return r
}

// kill SIGKILLs the replica: no deferred work, no River stop, its transactions cut.
func (r *replica) kill(t *testing.T) {
	t.Helper()
	select {
	case <-r.exited:
		t.Fatalf("replica exited before the kill: %v", r.err)
	default:
	}
	if err := r.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-r.exited
	var ee *exec.ExitError
	if !errors.As(r.err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("replica did not die of SIGKILL: %v", r.err)
	}
}

func withParam(url, param string) string {
	if strings.Contains(url, "?") {
		return url + "&" + param
	}
	if strings.Contains(url, "://") {
		return url + "?" + param
	}
	return url + " " + param // keyword/value form
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// until polls cond until it holds, ctx ends or the replica r exits.
func until(t *testing.T, ctx context.Context, r *replica, what string, cond func() (bool, string)) {
	t.Helper()
	for {
		ok, state := cond()
		if ok {
			return
		}
		select {
		case <-r.exited:
			t.Fatalf("%s: the replica exited: %v; %s", what, r.err, state)
		case <-ctx.Done():
			t.Fatalf("%s: not within the test's bound; %s", what, state)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// A control-plane replica is SIGKILLed while an onboarding is in each of its steps, and
// again while a decommission is in each of its steps: every one of them is parked in
// its step's closing transaction (MAAS already called, the step's writes made, nothing
// committed: the worst moment to die). A replica started afterwards over the same
// database takes the killed one's jobs over (River's rescuer, after
// GANTRY_JOBS_RESCUE_STUCK_AFTER) and every workflow completes with one allocate, one
// commission where needed, one deploy and one node record per machine, and one release
// per decommissioned machine.
func TestSIGKILLInEachStepResumes(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	f := newFixture(t, fixtureOpts{booter: enrollingBooter})
	parkLog := filepath.Join(t.TempDir(), "parked")

	type machine struct {
		sys, parkWorkflow, parkStep string
		onb                         api.MaasOnboarding
	}
	var ms []*machine
	for _, step := range maas.OnboardingSteps {
		ms = append(ms, &machine{parkWorkflow: maas.KindOnboarding, parkStep: step})
	}
	for _, step := range maas.DecommissionSteps {
		ms = append(ms, &machine{parkWorkflow: maas.KindDecommission, parkStep: step})
	}
	for _, m := range ms {
		// Only a New machine is commissioned.
		m.sys = f.sim.AddMachine(maastest.MachineSpec{Hostname: parkName(m.parkWorkflow, m.parkStep), New: m.parkStep == maas.StepCommission})
	}

	r1 := startReplica(t, f, parkLog, 1)
	for _, m := range ms {
		r := f.onboard(t, m.sys)
		if r.StatusCode() != http.StatusAccepted {
			t.Fatalf("onboard %s: %d %s", m.sys, r.StatusCode(), r.Body)
		}
		m.onb = *r.JSON202
	}
	onboardingState := func(id uuid.UUID) (state, step string) {
		var cur *string
		if err := f.e.Pool.QueryRow(ctx, `SELECT state, current_step FROM maas_onboardings WHERE id = $1`, id).Scan(&state, &cur); err != nil {
			t.Fatal(err)
		}
		return state, deref(cur)
	}
	parkedSteps := func() map[string]bool {
		p, err := parked(parkLog)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	// Every onboarding step has an onboarding parked in it; the machines meant for the
	// decommission phase finished their onboarding.
	until(t, ctx, r1, "an onboarding parked in each step", func() (bool, string) {
		p := parkedSteps()
		var waiting []string
		for _, m := range ms {
			state, step := onboardingState(m.onb.ID)
			if m.parkWorkflow == maas.KindOnboarding && !p[m.onb.ID.String()+" "+m.parkStep] ||
				m.parkWorkflow == maas.KindDecommission && state != maas.StateSucceeded {
				waiting = append(waiting, fmt.Sprintf("%s: %s at %s", parkName(m.parkWorkflow, m.parkStep), state, step))
			}
		}
		return len(waiting) == 0, strings.Join(waiting, "; ")
	})
	for _, m := range ms[:len(maas.OnboardingSteps)] {
		// What committed says the onboarding is in the step it is parked in.
		if state, step := onboardingState(m.onb.ID); state != maas.StateRunning || step != m.parkStep {
			t.Fatalf("%s parked, but the onboarding is %s at %s", m.parkStep, state, step)
		}
	}
	r1.kill(t)

	r2 := startReplica(t, f, parkLog, 2)
	until(t, ctx, r2, "every onboarding succeeded after the restart", func() (bool, string) {
		var left []string
		for _, m := range ms {
			if state, step := onboardingState(m.onb.ID); state != maas.StateSucceeded {
				left = append(left, fmt.Sprintf("%s: %s at %s", m.onb.ID, state, step))
			}
		}
		return len(left) == 0, strings.Join(left, "; ")
	})
	for _, m := range ms {
		// Accepted MAAS actions on the machine (what a duplicate would change), and
		// deploy attempts of any outcome.
		st, _ := f.sim.Machine(m.sys)
		commissions := 0
		if m.parkStep == maas.StepCommission {
			commissions = 1
		}
		if st.Allocations != 1 || st.Deploys != 1 || st.Commissions != commissions || deploys(f.sim, m.sys) != 1 {
			t.Errorf("machine parked at %s/%s: %d allocations, %d commissions, %d deploys (%d attempts); want 1, %d, 1 (1)",
				m.parkWorkflow, m.parkStep, st.Allocations, st.Commissions, st.Deploys, deploys(f.sim, m.sys), commissions)
		}
		o, err := f.admin.GetMaasOnboardingWithResponse(ctx, m.onb.ID, &api.GetMaasOnboardingParams{})
		if err != nil || o.JSON200 == nil {
			t.Fatalf("get onboarding: %v", err)
		}
		m.onb = *o.JSON200
		for _, s := range m.onb.Steps {
			// The killed attempt was taken over, not retried as a new attempt.
			if s.Attempts > 1 {
				t.Errorf("%s: step %s ran %d attempts", m.onb.ID, s.Name, s.Attempts)
			}
		}
	}
	if n := f.e.Count(t, `SELECT count(*) FROM nodes`); n != len(ms) {
		t.Errorf("%d node records for %d machines", n, len(ms))
	}
	if n := f.e.Count(t, `SELECT count(DISTINCT node_id) FROM maas_onboardings WHERE state = 'succeeded'`); n != len(ms) {
		t.Errorf("%d distinct nodes for %d onboardings", n, len(ms))
	}
	if n := f.e.Count(t, `SELECT count(*) FROM nodes WHERE schedule_state = 'schedulable'`); n != len(ms) {
		t.Errorf("%d of %d nodes uncordoned", n, len(ms))
	}

	// Decommissions, one parked in each step, and the same again.
	decoms := map[uuid.UUID]*machine{}
	for _, m := range ms[len(maas.OnboardingSteps):] {
		r := f.decommission(t, *m.onb.NodeID, api.CreateNodeDecommissionJSONRequestBody{})
		if r.JSON202 == nil {
			t.Fatalf("decommission: %d %s", r.StatusCode(), r.Body)
		}
		decoms[r.JSON202.ID] = m
	}
	decomState := func(id uuid.UUID) (state, step string) {
		var cur *string
		if err := f.e.Pool.QueryRow(ctx, `SELECT state, current_step FROM maas_decommissions WHERE id = $1`, id).Scan(&state, &cur); err != nil {
			t.Fatal(err)
		}
		return state, deref(cur)
	}
	until(t, ctx, r2, "a decommission parked in each step", func() (bool, string) {
		p := parkedSteps()
		var waiting []string
		for id, m := range decoms {
			if !p[id.String()+" "+m.parkStep] {
				state, step := decomState(id)
				waiting = append(waiting, fmt.Sprintf("%s: %s at %s", m.parkStep, state, step))
			}
		}
		return len(waiting) == 0, strings.Join(waiting, "; ")
	})
	for id, m := range decoms {
		if state, step := decomState(id); state != maas.StateRunning || step != m.parkStep {
			t.Fatalf("%s parked, but the decommission is %s at %s", m.parkStep, state, step)
		}
	}
	r2.kill(t)

	r3 := startReplica(t, f, parkLog, 3)
	until(t, ctx, r3, "every decommission succeeded after the restart", func() (bool, string) {
		var left []string
		for id, m := range decoms {
			if state, step := decomState(id); state != maas.StateSucceeded {
				left = append(left, fmt.Sprintf("%s: %s at %s", m.parkStep, state, step))
			}
		}
		return len(left) == 0, strings.Join(left, "; ")
	})
	releases := map[string]int{} // release attempts of any outcome
	for _, c := range f.sim.Calls() {
		if c.Op == "release" {
			releases[c.SystemID]++
		}
	}
	for _, m := range decoms {
		st, _ := f.sim.Machine(m.sys)
		if releases[m.sys] != 1 || st.Releases != 1 || st.Status != maastest.StatusReady {
			t.Errorf("machine parked at decommission/%s: %d release calls (%d accepted), %v in MAAS; want 1, Ready", m.parkStep, releases[m.sys], st.Releases, st.Status)
		}
	}
	if n := f.e.Count(t, `SELECT count(*) FROM nodes`); n != len(ms)-len(decoms) {
		t.Errorf("%d nodes left, want %d", n, len(ms)-len(decoms))
	}
	if n := f.e.Count(t, `SELECT count(*) FROM maas_decommissions WHERE state = 'succeeded'`); n != len(decoms) {
		t.Errorf("%d decommissions succeeded, want %d", n, len(decoms))
	}
}
