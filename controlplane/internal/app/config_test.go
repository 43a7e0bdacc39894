package app

import (
	"runtime/debug"
	"strings"
	"testing"
	"time"
)

// The job runner's rescue delay and the MAAS step attempt timeout come from the
// environment, default to what they were (zero: the runner's 5 minutes; 3 minutes), and
// a rescue River would refuse or never honour is refused at load.
func TestJobRescueFromEnvironment(t *testing.T) {
	cfg, err := LoadConfig(true)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Jobs.RescueStuckJobsAfter != 0 || cfg.Jobs.JobTimeout != 0 || cfg.Maas.StepAttemptTimeout != 3*time.Minute {
		t.Fatalf("defaults: rescue %s, job timeout %s, attempt %s", cfg.Jobs.RescueStuckJobsAfter, cfg.Jobs.JobTimeout, cfg.Maas.StepAttemptTimeout)
	}

	t.Setenv("GANTRY_MAAS_STEP_ATTEMPT_TIMEOUT", "30s")
	t.Setenv("GANTRY_JOBS_JOB_TIMEOUT", "30s")
	t.Setenv("GANTRY_JOBS_RESCUE_STUCK_AFTER", "45s")
	t.Setenv("GANTRY_JOBS_MAX_WORKERS", "7")
	cfg, err = LoadConfig(true)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Jobs.RescueStuckJobsAfter != 45*time.Second || cfg.Jobs.JobTimeout != 30*time.Second || cfg.Jobs.MaxWorkers != 7 || cfg.Maas.StepAttemptTimeout != 30*time.Second {
		t.Fatalf("from the environment: %+v, attempt %s", cfg.Jobs, cfg.Maas.StepAttemptTimeout)
	}

	for _, c := range []struct{ rescue, attempt, job, want string }{
		{"30s", "30s", "10s", "must exceed GANTRY_MAAS_STEP_ATTEMPT_TIMEOUT"},
		{"2m", "3m", "", "must exceed GANTRY_MAAS_STEP_ATTEMPT_TIMEOUT"}, // below the default attempt timeout
		{"45s", "30s", "", "GANTRY_JOBS_JOB_TIMEOUT"},                    // below River's default job timeout
		{"45s", "30s", "1m", "GANTRY_JOBS_JOB_TIMEOUT"},
	} {
		t.Setenv("GANTRY_JOBS_RESCUE_STUCK_AFTER", c.rescue)
		t.Setenv("GANTRY_MAAS_STEP_ATTEMPT_TIMEOUT", c.attempt)
		t.Setenv("GANTRY_JOBS_JOB_TIMEOUT", c.job)
		if _, err := LoadConfig(true); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("rescue %s attempt %s job %q: %v, want an error naming %s", c.rescue, c.attempt, c.job, err, c.want)
		}
	}
}

// GANTRY_GC_PERCENT defaults to 200, accepts 0 (Go's default) and 50-1000 and refuses
// the rest at load; ApplyGCPercent sets it unless GOGC is set.
func TestGCPercent(t *testing.T) {
	t.Setenv("GOGC", "")
	cfg, err := LoadConfig(true)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.GCPercent != 200 {
		t.Fatalf("default GC percent %d", cfg.GCPercent)
	}
	for v, ok := range map[string]bool{"0": true, "50": true, "1000": true, "49": false, "1001": false, "-1": false} {
		t.Setenv("GANTRY_GC_PERCENT", v)
		_, err := LoadConfig(true)
		if (err == nil) != ok {
			t.Errorf("GANTRY_GC_PERCENT=%s: %v", v, err)
		}
		if err != nil && !strings.Contains(err.Error(), "GANTRY_GC_PERCENT") {
			t.Errorf("GANTRY_GC_PERCENT=%s: the error does not name the variable: %v", v, err)
		}
	}

	before := debug.SetGCPercent(100)
	defer debug.SetGCPercent(before)
	if got := ApplyGCPercent(300); got != 300 || debug.SetGCPercent(300) != 300 {
		t.Fatalf("ApplyGCPercent(300) = %d", got)
	}
	if got := ApplyGCPercent(0); got != 300 {
		t.Fatalf("ApplyGCPercent(0) changed the target: reports %d", got)
	}
	// GOGC wins: its value stays in force.
	t.Setenv("GOGC", "150")
	debug.SetGCPercent(150) // what the runtime read from GOGC at start
	if got := ApplyGCPercent(400); got != 150 || debug.SetGCPercent(150) != 150 {
		t.Fatalf("with GOGC=150 ApplyGCPercent(400) = %d", got)
	}
}
