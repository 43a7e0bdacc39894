package main

// The MAAS section (issue 25's benchmark): 100 concurrent onboardings against the MAAS
// simulator with zero-length steps, each to `succeeded` (allocate, create the node and
// its enrollment token, deploy with cloud-init user data, wait for Deployed, the booted
// machine enrols and reports its GPUs, uncordon: every step a River job inserted in the
// transaction of the step before), vs the same number of bare gomaasclient call
// sequences (allocate, deploy, poll until Deployed) against a second simulator, in the
// same run. Wall time and this process's CPU per onboarding are printed (the simulator
// runs in this process on both sides; PostgreSQL's backends are not counted).

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"sync"
	"syscall"
	"time"

	"github.com/canonical/gomaasclient/client"
	"github.com/canonical/gomaasclient/entity"
	"github.com/canonical/gomaasclient/entity/node"

	"github.com/gantry-gpu/gantry/controlplane/internal/catalog"
	"github.com/gantry-gpu/gantry/controlplane/internal/fleet"
	"github.com/gantry-gpu/gantry/controlplane/internal/maas"
	"github.com/gantry-gpu/gantry/controlplane/internal/maas/maastest"
)

var maasOnboardings = envInt("GANTRY_BENCH_MAAS_ONBOARDINGS", 100)

var benchTokenRE = regexp.MustCompile(`gne_[A-Za-z0-9_-]{43}`)

func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func runMaas(ctx context.Context, fx *fixture) error {
	a := fx.app
	svc := a.Maas
	svc.Config.PollInterval = 10 * time.Millisecond
	svc.Config.ControlPlaneURL = "http://127.0.0.1:8080" // what the user data points machines at
	// The booted machine's agent, as far as the control plane sees it: it enrols with
	// the token from the user data and reports 8 H100s.
	booter := maastest.BooterFunc(func(ctx context.Context, req maastest.BootRequest) (maastest.Instance, string, error) {
		enr, err := a.Nodes.Enroll(ctx, benchTokenRE.FindString(string(req.UserData)), req.Hostname, "1.0.0")
		if err != nil {
			return nil, "", err
		}
		inv := fleet.Inventory{AgentVersion: "1.0.0", Hostname: req.Hostname}
		for i := range 8 {
			inv.GPUs = append(inv.GPUs, fleet.GPU{Index: i, UUID: fmt.Sprintf("GPU-%s-%d", req.SystemID, i), Model: "NVIDIA H100 80GB HBM3",
				MemoryBytes: 80 << 30, PCIBusID: fmt.Sprintf("0000:%02x:00.0", i)})
		}
		if err := a.Nodes.NodeConnected(ctx, enr.NodeID, inv, time.Now()); err != nil {
			return nil, "", err
		}
		return nil, "", a.Nodes.NodeStatus(ctx, enr.NodeID, true, time.Now())
	})
	sim := maastest.New(maastest.Config{Booter: booter})
	sim.Start(false)
	defer sim.Close()
	bare := maastest.New(maastest.Config{})
	bare.Start(false)
	defer bare.Close()

	if _, err := svc.Catalog.CreateRegion(ctx, catalog.RegionSpec{Code: "maas-bench", Label: "MAAS bench"}); err != nil {
		return err
	}
	if _, err := svc.Catalog.CreateSKU(ctx, catalog.SKUSpec{ID: "maas-h100.8x", GPUModel: "NVIDIA H100 80GB HBM3", GPUCount: 8, VCPU: 64,
		MemoryGiB: 512, DiskGiB: 2000, UsageUnit: "gpu_second.maas-h100", Regions: []string{"maas-bench"}}); err != nil {
		return err
	}
	img, err := svc.Catalog.CreateOSImage(ctx, catalog.OSImageSpec{Name: "maas-bench-noble", Distribution: "ubuntu", Version: "24.04", ImageRef: "ubuntu/noble"})
	if err != nil {
		return err
	}
	site, err := svc.CreateSite(ctx, maas.SiteSpec{Name: "bench", Region: "maas-bench", APIURL: sim.URL(), APIKey: sim.APIKey(), TLSVerify: true})
	if err != nil {
		return err
	}
	name := "bench"
	prof, err := svc.CreateProfile(ctx, maas.ProfileSpec{Name: &name, OSImageID: &img.ID, SKUs: []string{"maas-h100.8x"}})
	if err != nil {
		return err
	}
	ids := make([]string, maasOnboardings)
	bareIDs := make([]string, maasOnboardings)
	for i := range ids {
		ids[i] = sim.AddMachine(maastest.MachineSpec{Hostname: fmt.Sprintf("gpu-%03d", i), IPAddresses: []string{fmt.Sprintf("10.40.%d.%d", i/200, i%200+1)}})
		bareIDs[i] = bare.AddMachine(maastest.MachineSpec{})
	}

	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = a.Jobs.Run(runCtx) }()
	defer func() { stop(); <-done }()

	fmt.Fprintf(os.Stderr, "maas bench: %d machines ready, onboarding\n", maasOnboardings)
	// Gantry: every onboarding to succeeded.
	cpu0, t0 := processCPU(), time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, maasOnboardings)
	onbs := make([]maas.Onboarding, maasOnboardings)
	for i := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sys := ids[i]
			o, err := svc.CreateOnboarding(ctx, maas.OnboardingSpec{SiteID: site.ID, ProfileID: prof.ID, SystemID: &sys})
			if err != nil {
				errs <- err
				return
			}
			onbs[i] = o
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		return fmt.Errorf("onboarding: %w", err)
	}
	deadline := time.Now().Add(10 * time.Minute)
	for {
		var left, failed int
		if err := a.Pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE state NOT IN ('succeeded','failed')), count(*) FILTER (WHERE state = 'failed') FROM maas_onboardings`).Scan(&left, &failed); err != nil {
			return err
		}
		if failed > 0 {
			var step, reason string
			_ = a.Pool.QueryRow(ctx, `SELECT current_step, failure_reason FROM maas_onboardings WHERE state = 'failed' LIMIT 1`).Scan(&step, &reason)
			return fmt.Errorf("%d onboardings failed (one at %s: %s)", failed, step, reason)
		}
		if left == 0 {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d onboardings unfinished after 10 minutes", left)
		}
		if os.Getenv("GANTRY_BENCH_VERBOSE") != "" {
			var steps string
			_ = a.Pool.QueryRow(ctx, `SELECT string_agg(current_step || '=' || n, ' ') FROM (SELECT current_step, count(*) n FROM maas_onboardings WHERE current_step IS NOT NULL GROUP BY 1) x`).Scan(&steps)
			fmt.Fprintf(os.Stderr, "maas bench: %s left %d: %s\n", time.Since(t0).Round(time.Millisecond), left, steps)
			time.Sleep(500 * time.Millisecond)
		}
		time.Sleep(10 * time.Millisecond)
	}
	gWall, gCPU := time.Since(t0), processCPU()-cpu0

	// Bare gomaasclient: allocate, deploy, poll until Deployed.
	c, err := client.GetClient(bare.URL(), bare.APIKey(), "2.0")
	if err != nil {
		return err
	}
	cpu0, t0 = processCPU(), time.Now()
	errs = make(chan error, maasOnboardings)
	for _, sys := range bareIDs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := c.Machines.Allocate(&entity.MachineAllocateParams{SystemID: sys}); err != nil {
				errs <- err
				return
			}
			if _, err := c.Machine.Deploy(sys, &entity.MachineDeployParams{UserData: "I2Nsb3VkLWNvbmZpZwo=", DistroSeries: "noble"}); err != nil {
				errs <- err
				return
			}
			for {
				m, err := c.Machine.Get(sys)
				if err != nil {
					errs <- err
					return
				}
				if m.Status == node.StatusDeployed {
					return
				}
				time.Sleep(10 * time.Millisecond)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		return fmt.Errorf("bare sequence: %w", err)
	}
	bWall, bCPU := time.Since(t0), processCPU()-cpu0

	load, _ := os.ReadFile("/proc/loadavg")
	fmt.Printf("\nmaas: %d concurrent onboardings to succeeded (zero-length MAAS steps) vs %d bare gomaasclient allocate+deploy+poll sequences, same run (load %s)\n",
		maasOnboardings, maasOnboardings, trimLoad(load))
	fmt.Printf("  gantry onboarding: wall %8.2fs  cpu/onboarding %8.2fms\n", gWall.Seconds(), float64(gCPU.Microseconds())/1000/float64(maasOnboardings))
	fmt.Printf("  bare gomaasclient: wall %8.2fs  cpu/sequence   %8.2fms\n", bWall.Seconds(), float64(bCPU.Microseconds())/1000/float64(maasOnboardings))
	fmt.Printf("  ratio: wall %.1fx, cpu %.1fx\n", gWall.Seconds()/bWall.Seconds(), float64(gCPU)/float64(max(bCPU, 1)))
	return nil
}

func trimLoad(b []byte) string {
	s := string(b)
	for i, r := range s {
		if r == '\n' {
			return s[:i]
		}
	}
	return s
}
