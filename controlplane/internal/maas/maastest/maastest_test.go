package maastest

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"fmt"
	"mime/multipart"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/canonical/gomaasclient/client"
	"github.com/canonical/gomaasclient/entity"
	"github.com/canonical/gomaasclient/entity/node"
)

func start(t *testing.T, cfg Config) (*Server, *client.Client) {
	t.Helper()
	s := New(cfg)
	url := s.Start(false)
	t.Cleanup(s.Close)
	return s, clientFor(t, url, s.APIKey())
}

func clientFor(t *testing.T, url, key string) *client.Client {
	t.Helper()
	c, err := client.GetClientWithTransport(url, key, "2.0", &http.Transport{ResponseHeaderTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func wait(t *testing.T, s *Server, id string, want Status) Machine {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.WaitStatus(ctx, id, want); err != nil {
		t.Fatal(err)
	}
	m, _ := s.Machine(id)
	return m
}

// statusOf reads the machine through the API, as a client sees it.
func statusOf(t *testing.T, c *client.Client, id string) *entity.Machine {
	t.Helper()
	m, err := c.Machine.Get(id)
	if err != nil {
		t.Fatalf("get %s: %v", id, err)
	}
	return m
}

func wantHTTP(t *testing.T, err error, status int) {
	t.Helper()
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("%d", status)) {
		t.Fatalf("got %v, want an HTTP %d", err, status)
	}
}

func TestAuth(t *testing.T) {
	s, c := start(t, Config{})
	if _, err := c.Machines.Get(&entity.MachinesParams{}); err != nil {
		t.Fatalf("valid key: %v", err)
	}
	if v, err := clientFor(t, s.URL(), "a:b:c").Version.Get(); err != nil || v.Version != Version {
		t.Fatalf("version/ is anonymous in MAAS: %v %v", v, err)
	}
	parts := strings.Split(s.APIKey(), ":")
	for name, key := range map[string]string{
		"unknown key":    NewAPIKey(),
		"wrong secret":   parts[0] + ":" + parts[1] + ":" + strings.Repeat("x", 32),
		"wrong token":    parts[0] + ":" + "nottoken" + ":" + parts[2],
		"wrong consumer": "nope:" + parts[1] + ":" + parts[2],
	} {
		_, err := clientFor(t, s.URL(), key).Machines.Get(&entity.MachinesParams{})
		if err == nil || !strings.Contains(err.Error(), "401") {
			t.Errorf("%s: %v, want 401", name, err)
		}
		if err != nil && strings.Contains(err.Error(), strings.Split(key, ":")[2]) {
			t.Errorf("%s: the 401 echoes the token secret", name)
		}
	}
	// No signature at all, and a signature method other than PLAINTEXT.
	for name, h := range map[string]string{
		"none":  "",
		"hmac":  `OAuth oauth_consumer_key="` + parts[0] + `", oauth_token="` + parts[1] + `", oauth_signature_method="HMAC-SHA1", oauth_signature="%26` + parts[2] + `", oauth_nonce="1", oauth_timestamp="1"`,
		"nonce": `OAuth oauth_consumer_key="` + parts[0] + `", oauth_token="` + parts[1] + `", oauth_signature_method="PLAINTEXT", oauth_signature="%26` + parts[2] + `", oauth_timestamp="1"`,
	} {
		req, _ := http.NewRequest(http.MethodGet, s.URL()+"/api/2.0/machines/", nil)
		if h != "" {
			req.Header.Set("Authorization", h)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != http.StatusUnauthorized {
			t.Errorf("%s: %d, want 401", name, res.StatusCode)
		}
	}

	// Rotation: a new key works alongside the old one until the old one is revoked.
	next := NewAPIKey()
	if _, err := clientFor(t, s.URL(), next).Users.Whoami(); err == nil {
		t.Fatal("a key not yet added was accepted")
	}
	if err := s.AddAPIKey(next); err != nil {
		t.Fatal(err)
	}
	if u, err := clientFor(t, s.URL(), next).Users.Whoami(); err != nil || u.UserName != "gantry" {
		t.Fatalf("rotated key: %v %v", u, err)
	}
	s.RevokeAPIKey(s.APIKey())
	if _, err := c.Users.Whoami(); err == nil || !strings.Contains(err.Error(), "401") {
		t.Fatalf("revoked key: %v", err)
	}
}

func TestLifecycle(t *testing.T) {
	s, c := start(t, Config{})
	id := s.AddMachine(MachineSpec{SystemID: "abc123", Hostname: "gpu-a", New: true, Tags: []string{"gpu", "rack1"}})
	other := s.AddMachine(MachineSpec{Hostname: "gpu-b", GPU: "mock-a100", GPUCount: 4})

	m := statusOf(t, c, id)
	if m.Status != node.StatusNew || m.StatusName != "New" || m.Hostname != "gpu-a" || m.CPUCount != 0 || m.PowerState != "off" {
		t.Fatalf("new machine: %+v", m)
	}
	if devs, err := c.NodeDevices.Get(id, &entity.NodeDeviceParams{}); err != nil || len(devs) != 0 {
		t.Fatalf("an uncommissioned machine has no inventory: %v %v", devs, err)
	}
	// A New machine cannot be allocated or deployed.
	_, err := c.Machines.Allocate(&entity.MachineAllocateParams{SystemID: id})
	wantHTTP(t, err, 409)
	_, err = c.Machine.Deploy(id, &entity.MachineDeployParams{})
	wantHTTP(t, err, 409)

	if m, err = c.Machine.Commission(id, &entity.MachineCommissionParams{}); err != nil || m.Status != node.StatusCommissioning {
		t.Fatalf("commission: %v %+v", err, m)
	}
	wait(t, s, id, StatusReady)
	m = statusOf(t, c, id)
	if m.CPUCount != 64 || m.Memory != 512*1024 || m.Pool.Name != "default" || len(m.TagNames) != 2 {
		t.Fatalf("commissioned: %+v", m)
	}
	gpus, err := c.NodeDevices.Get(id, &entity.NodeDeviceParams{HardwareType: "GPU"})
	if err != nil || len(gpus) != 8 {
		t.Fatalf("GPU inventory: %v %v", gpus, err)
	}
	if g := gpus[0]; g.VendorID != "10de" || g.ProductID != "2330" || g.VendorName != NVIDIAVendorName || g.HardwareType != entity.GPU || g.Bus != entity.PCIE {
		t.Fatalf("GPU device: %+v", g)
	}
	if all, _ := c.NodeDevices.Get(other, &entity.NodeDeviceParams{VendorID: "10de"}); len(all) != 4 || all[0].ProductID != "20b0" {
		t.Fatalf("A100 machine devices: %+v", all)
	}

	// Allocate by constraints: tags must all match; a second allocate of it finds nothing.
	if _, err := c.Machines.Allocate(&entity.MachineAllocateParams{Tags: []string{"gpu", "rack2"}}); err == nil {
		t.Fatal("allocated with a tag no machine has")
	}
	m, err = c.Machines.Allocate(&entity.MachineAllocateParams{Tags: []string{"gpu"}, AgentName: "gantry-onb-1", Comment: "onboarding"})
	if err != nil || m.SystemID != id || m.Status != node.StatusAllocated || m.Owner != "gantry" {
		t.Fatalf("allocate: %v %+v", err, m)
	}
	_, err = c.Machines.Allocate(&entity.MachineAllocateParams{SystemID: id})
	wantHTTP(t, err, 409)
	if list, err := c.Machines.Get(&entity.MachinesParams{AgentName: []string{"gantry-onb-1"}}); err != nil || len(list) != 1 || list[0].SystemID != id {
		t.Fatalf("list by agent_name: %v %v", list, err)
	}

	// Deploy with base64 user data; bad base64 is a 400 and changes nothing.
	_, err = c.Machine.Deploy(id, &entity.MachineDeployParams{UserData: "%%%not base64"})
	wantHTTP(t, err, 400)
	if got := statusOf(t, c, id); got.Status != node.StatusAllocated {
		t.Fatalf("after a bad deploy: %s", got.StatusName)
	}
	ud := "#cloud-config\nruncmd: [[true]]\n"
	m, err = c.Machine.Deploy(id, &entity.MachineDeployParams{UserData: base64.StdEncoding.EncodeToString([]byte(ud)), DistroSeries: "noble"})
	if err != nil || m.Status != node.StatusDeploying {
		t.Fatalf("deploy: %v %+v", err, m)
	}
	got := wait(t, s, id, StatusDeployed)
	if string(got.UserData) != ud || got.DistroSeries != "noble" || got.Deploys != 1 || got.PowerState != "on" {
		t.Fatalf("deployed: %+v", got)
	}
	// Deployed machines cannot be commissioned or deployed again.
	_, err = c.Machine.Commission(id, &entity.MachineCommissionParams{})
	wantHTTP(t, err, 409)
	_, err = c.Machine.Deploy(id, &entity.MachineDeployParams{})
	wantHTTP(t, err, 409)

	// Release with quick erase: Disk erasing, then Ready with the owner gone.
	m, err = c.Machine.Release(id, &entity.MachineReleaseParams{Erase: true, QuickErase: true, Comment: "decommission"})
	if err != nil || m.Status != node.StatusDiskErasing {
		t.Fatalf("release: %v %+v", err, m)
	}
	got = wait(t, s, id, StatusReady)
	if got.LastErase != "quick" || got.Owner != "" || got.PowerState != "off" || got.Releases != 1 || got.UserData != nil {
		t.Fatalf("released: %+v", got)
	}
	// Release of a Ready machine is a state violation, as in MAAS.
	_, err = c.Machine.Release(id, &entity.MachineReleaseParams{})
	wantHTTP(t, err, 409)
	// Secure erase and plain release.
	if _, err := c.Machine.Deploy(id, &entity.MachineDeployParams{}); err != nil { // Ready: allocates implicitly
		t.Fatal(err)
	}
	wait(t, s, id, StatusDeployed)
	if _, err := c.Machine.Release(id, &entity.MachineReleaseParams{Erase: true, SecureErase: true}); err != nil {
		t.Fatal(err)
	}
	if got = wait(t, s, id, StatusReady); got.LastErase != "secure" || got.Allocations != 2 {
		t.Fatalf("secure erase: %+v", got)
	}

	// Unknown machine and unknown op.
	_, err = c.Machine.Get("nope00")
	wantHTTP(t, err, 404)
	_, err = c.Machine.Lock(id, "")
	wantHTTP(t, err, 400)

	calls := s.Calls()
	deploys := 0
	for _, cl := range calls {
		if cl.Op == "deploy" && cl.Status == 200 && cl.SystemID == id {
			deploys++
		}
	}
	if deploys != 2 {
		t.Fatalf("recorded %d successful deploys, want 2", deploys)
	}
}

func TestInjectedFailuresThenRetry(t *testing.T) {
	s, c := start(t, Config{})
	id := s.AddMachine(MachineSpec{New: true})
	mustOK := func(_ *entity.Machine, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}

	s.Inject(id, FailCommissioning)
	mustOK(c.Machine.Commission(id, &entity.MachineCommissionParams{}))
	if m := wait(t, s, id, StatusFailedCommissioning); m.StatusMessage == "" {
		t.Fatal("no status message on failure")
	}
	mustOK(c.Machine.Commission(id, &entity.MachineCommissionParams{}))
	wait(t, s, id, StatusReady)

	s.Inject(id, FailTesting)
	mustOK(c.Machine.Commission(id, &entity.MachineCommissionParams{}))
	wait(t, s, id, StatusFailedTesting)
	mustOK(c.Machine.Commission(id, &entity.MachineCommissionParams{}))
	wait(t, s, id, StatusReady)

	mustOK(c.Machines.Allocate(&entity.MachineAllocateParams{SystemID: id}))
	s.Inject(id, FailDeployment)
	mustOK(c.Machine.Deploy(id, &entity.MachineDeployParams{}))
	wait(t, s, id, StatusFailedDeployment)
	// MAAS's way back from a failed deployment: release, allocate, deploy again.
	mustOK(c.Machine.Release(id, &entity.MachineReleaseParams{}))
	wait(t, s, id, StatusReady)
	mustOK(c.Machines.Allocate(&entity.MachineAllocateParams{SystemID: id}))
	s.Inject(id, PowerFailure)
	mustOK(c.Machine.Deploy(id, &entity.MachineDeployParams{}))
	if m := wait(t, s, id, StatusFailedDeployment); !strings.Contains(m.StatusMessage, "Power on") {
		t.Fatalf("power failure message %q", m.StatusMessage)
	}
	mustOK(c.Machine.Release(id, &entity.MachineReleaseParams{}))
	wait(t, s, id, StatusReady)
	mustOK(c.Machine.Deploy(id, &entity.MachineDeployParams{}))
	wait(t, s, id, StatusDeployed)

	// Power actions with a dead BMC answer 503 (once).
	s.Inject(id, PowerFailure)
	_, err := c.Machine.GetPowerState(id)
	wantHTTP(t, err, 503)
	if ps, err := c.Machine.GetPowerState(id); err != nil || ps.State != "on" {
		t.Fatalf("power state: %v %v", ps, err)
	}
	s.Inject(id, PowerFailure)
	_, err = c.Machine.PowerOff(id, &entity.MachinePowerOffParams{})
	wantHTTP(t, err, 503)

	// Release failures, with and without erase.
	s.Inject(id, FailErasing)
	mustOK(c.Machine.Release(id, &entity.MachineReleaseParams{Erase: true, QuickErase: true}))
	wait(t, s, id, StatusFailedDiskErasing)
	s.Inject(id, FailReleasing)
	mustOK(c.Machine.Release(id, &entity.MachineReleaseParams{}))
	wait(t, s, id, StatusFailedReleasing)
	mustOK(c.Machine.Release(id, &entity.MachineReleaseParams{}))
	wait(t, s, id, StatusReady)

	// Missing: nothing can be done with it until it is back.
	s.SetMissing(id, true)
	if m := statusOf(t, c, id); m.Status != node.StatusMissing {
		t.Fatalf("missing: %s", m.StatusName)
	}
	_, err = c.Machines.Allocate(&entity.MachineAllocateParams{SystemID: id})
	wantHTTP(t, err, 409)
	_, err = c.Machine.GetPowerState(id)
	wantHTTP(t, err, 503)
	s.SetMissing(id, false)
	mustOK(c.Machines.Allocate(&entity.MachineAllocateParams{SystemID: id}))
}

func TestStallTimesOutAndAbort(t *testing.T) {
	s, c := start(t, Config{Durations: Durations{NodeTimeout: 50 * time.Millisecond}})
	id := s.AddMachine(MachineSpec{})
	s.Inject(id, Stall)
	if _, err := c.Machine.Deploy(id, &entity.MachineDeployParams{}); err != nil {
		t.Fatal(err)
	}
	if m := wait(t, s, id, StatusFailedDeployment); !strings.Contains(m.StatusMessage, "timed out") {
		t.Fatalf("stalled deploy: %q", m.StatusMessage)
	}

	// A step still running (hour-long durations) is aborted back where it came from.
	s2, c2 := start(t, Config{Durations: Durations{Commissioning: time.Hour, Deploying: time.Hour}})
	id2 := s2.AddMachine(MachineSpec{})
	if _, err := c2.Machine.Deploy(id2, &entity.MachineDeployParams{}); err != nil {
		t.Fatal(err)
	}
	if m := statusOf(t, c2, id2); m.Status != node.StatusDeploying {
		t.Fatalf("deploying: %s", m.StatusName)
	}
	if m, err := c2.Machine.Abort(id2, "changed my mind"); err != nil || m.Status != node.StatusAllocated {
		t.Fatalf("abort deploy: %v %+v", err, m)
	}
	_, err := c2.Machine.Abort(id2, "")
	wantHTTP(t, err, 409)
	if _, err := c2.Machine.Release(id2, &entity.MachineReleaseParams{}); err != nil {
		t.Fatal(err)
	}
	wait(t, s2, id2, StatusReady)
	if _, err := c2.Machine.Commission(id2, &entity.MachineCommissionParams{}); err != nil {
		t.Fatal(err)
	}
	if m, err := c2.Machine.Abort(id2, ""); err != nil || m.Status != node.StatusReady {
		t.Fatalf("abort commissioning: %v %+v", err, m)
	}
	if m, err := c2.Machine.MarkBroken(id2, "bad PSU"); err != nil || m.Status != node.StatusBroken {
		t.Fatalf("mark broken: %v %+v", err, m)
	}
	if m, err := c2.Machine.MarkFixed(id2, ""); err != nil || m.Status != node.StatusReady {
		t.Fatalf("mark fixed: %v %+v", err, m)
	}
}

func TestConcurrentAllocateOneWins(t *testing.T) {
	s, c := start(t, Config{})
	id := s.AddMachine(MachineSpec{})
	var wins, conflicts atomic.Int32
	var wg sync.WaitGroup
	for i := 0; i < 16; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := c.Machines.Allocate(&entity.MachineAllocateParams{SystemID: id})
			switch {
			case err == nil:
				wins.Add(1)
			case strings.Contains(err.Error(), "409"):
				conflicts.Add(1)
			default:
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if wins.Load() != 1 || conflicts.Load() != 15 {
		t.Fatalf("%d wins, %d conflicts", wins.Load(), conflicts.Load())
	}
}

// TestMultipartForm: MAAS's API takes multipart bodies (gomaasclient sends them when a
// call carries files); the simulator reads those too.
func TestMultipartForm(t *testing.T) {
	s, _ := start(t, Config{})
	id := s.AddMachine(MachineSpec{Tags: []string{"mp"}})
	var body bytes.Buffer
	w := multipart.NewWriter(&body)
	_ = w.WriteField("system_id", id)
	_ = w.WriteField("agent_name", "multipart")
	w.Close()
	req, _ := http.NewRequest(http.MethodPost, s.URL()+"/api/2.0/machines/?op=allocate", &body)
	req.Header.Set("Content-Type", w.FormDataContentType())
	p := strings.Split(s.APIKey(), ":")
	req.Header.Set("Authorization", `OAuth oauth_consumer_key="`+p[0]+`", oauth_token="`+p[1]+`", oauth_signature_method="PLAINTEXT", oauth_signature="%26`+p[2]+`", oauth_nonce="abc", oauth_timestamp="1700000000", oauth_version="1.0"`)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if m, _ := s.Machine(id); res.StatusCode != 200 || m.Status != StatusAllocated || m.AgentName != "multipart" {
		t.Fatalf("multipart allocate: %d %+v", res.StatusCode, m)
	}
}

type fakeInstance struct{ stops, starts atomic.Int32 }

func (f *fakeInstance) Stop() error                     { f.stops.Add(1); return nil }
func (f *fakeInstance) Start(ctx context.Context) error { f.starts.Add(1); return nil }

func TestBooterLifecycle(t *testing.T) {
	inst := &fakeInstance{}
	reqs := make(chan BootRequest, 4)
	s, c := start(t, Config{Booter: BooterFunc(func(ctx context.Context, req BootRequest) (Instance, string, error) {
		reqs <- req
		return inst, "/sandbox/" + req.Hostname, nil
	})})
	id := s.AddMachine(MachineSpec{Hostname: "gpu-boot", GPU: "mock-h200"})
	ud := "#cloud-config\n{}\n"
	if _, err := c.Machine.Deploy(id, &entity.MachineDeployParams{UserData: base64.StdEncoding.EncodeToString([]byte(ud))}); err != nil {
		t.Fatal(err)
	}
	req := <-reqs
	if req.SystemID != id || req.Hostname != "gpu-boot" || string(req.UserData) != ud || req.GPUBackend != "mock-h200" {
		t.Fatalf("boot request %+v", req)
	}
	eventually(t, func() bool { m, _ := s.Machine(id); return m.Booted && m.BootDir == "/sandbox/gpu-boot" })
	// Power off stops it; power on starts it again without a second first boot.
	if _, err := c.Machine.PowerOff(id, &entity.MachinePowerOffParams{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, func() bool { return inst.stops.Load() == 1 })
	if _, err := c.Machine.PowerOn(id, &entity.MachinePowerOnParams{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, func() bool { return inst.starts.Load() == 1 })
	// Release stops it for good.
	if _, err := c.Machine.Release(id, &entity.MachineReleaseParams{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, func() bool { return inst.stops.Load() == 2 })
	if m := wait(t, s, id, StatusReady); m.Booted {
		t.Fatal("still booted after release")
	}
	select {
	case r := <-reqs:
		t.Fatalf("a second boot: %+v", r)
	default:
	}
}

func eventually(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 30s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestReadEnvFile(t *testing.T) {
	p := t.TempDir() + "/env"
	if err := os.WriteFile(p, []byte("# comment\n\nA=1\n B = two \nC=\"quoted value\"\nD='x'\n;also comment\nnoequals\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	got := strings.Join(readEnvFile(p), "|")
	if want := "A=1|B=two|C=quoted value|D=x"; got != want {
		t.Fatalf("readEnvFile = %q, want %q", got, want)
	}
	if readEnvFile(p+".missing") != nil {
		t.Fatal("a missing file is not empty")
	}
}

// TestTLS: Start(true) serves HTTPS; a client trusting the server's CA works, one with
// system roots only is refused (what a site without its CA bundle sees).
func TestTLS(t *testing.T) {
	s := New(Config{})
	url := s.Start(true)
	t.Cleanup(s.Close)
	if !strings.HasPrefix(url, "https://") {
		t.Fatalf("url %s", url)
	}
	s.AddMachine(MachineSpec{})
	pool := x509.NewCertPool()
	pool.AddCert(s.TLSServer().Certificate())
	good, err := client.GetTLSClient(url, s.APIKey(), "2.0", &tls.Config{RootCAs: pool})
	if err != nil {
		t.Fatal(err)
	}
	if ms, err := good.Machines.Get(&entity.MachinesParams{}); err != nil || len(ms) != 1 {
		t.Fatalf("with the CA: %v %v", ms, err)
	}
	bad, err := client.GetTLSClient(url, s.APIKey(), "2.0", &tls.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bad.Machines.Get(&entity.MachinesParams{}); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("without the CA: %v", err)
	}
}
