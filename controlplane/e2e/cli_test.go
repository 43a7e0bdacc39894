package e2e_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"encoding/pem"
	"errors"
	"flag"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/gantry-gpu/gantry/controlplane/internal/apitest"
	"github.com/gantry-gpu/gantry/nodeagent/config"
	"github.com/gantry-gpu/gantry/proto/api"
)

var updateGolden = flag.Bool("update", false, "rewrite the CLI golden files under testdata/cli")

var (
	cliOnce sync.Once
	cliBin  string
	cliErr  error
)

// buildCLI builds bin/gantry once per test binary, as `make build` does.
func buildCLI(t testing.TB) string {
	t.Helper()
	cliOnce.Do(func() {
		dir, err := os.MkdirTemp("", "gantry-cli-e2e-")
		if err != nil {
			cliErr = err
			return
		}
		cliBin = filepath.Join(dir, "gantry")
		out, err := exec.Command("go", "build", "-o", cliBin, "github.com/gantry-gpu/gantry/cli/cmd/gantry").CombinedOutput()
		if err != nil {
			cliErr = errors.New(string(out))
		}
	})
	if cliErr != nil {
		t.Fatalf("go build gantry: %v", cliErr)
	}
	return cliBin
}

// cliUser is one person's environment for the built binary: its own config dir and home.
type cliUser struct {
	t    testing.TB
	bin  string
	home string
	url  string
}

func newCLIUser(t testing.TB, url string) *cliUser {
	return &cliUser{t: t, bin: buildCLI(t), home: t.TempDir(), url: url}
}

func (u *cliUser) env() []string {
	return []string{"HOME=" + u.home, "XDG_CONFIG_HOME=" + filepath.Join(u.home, "config"), "GANTRY_URL=" + u.url, "PATH=" + os.Getenv("PATH")}
}

func (u *cliUser) configPath() string {
	return filepath.Join(u.home, "config", "gantry", "config.json")
}

// run runs `gantry args...` with stdin and returns stdout, stderr and the exit code.
func (u *cliUser) run(stdin string, args ...string) (string, string, int) {
	u.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, u.bin, args...)
	cmd.Env = u.env()
	cmd.Stdin = strings.NewReader(stdin)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		u.t.Fatalf("gantry %v: %v", args, err)
	}
	return out.String(), errOut.String(), code
}

// ok runs a command that must succeed and returns its stdout.
func (u *cliUser) ok(args ...string) string {
	u.t.Helper()
	out, errOut, code := u.run("", args...)
	if code != 0 {
		u.t.Fatalf("gantry %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), code, out, errOut)
	}
	return out
}

// fails runs a command that must fail with code and an error naming apiCode and a
// correlation id (when apiCode is set), and no Go stack trace.
func (u *cliUser) fails(code int, apiCode string, args ...string) string {
	u.t.Helper()
	out, errOut, got := u.run("", args...)
	if got != code {
		u.t.Fatalf("gantry %s: exit %d, want %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), got, code, out, errOut)
	}
	if !strings.HasPrefix(errOut, "Error: ") || strings.Contains(errOut, "goroutine ") || strings.Contains(errOut, "panic") {
		u.t.Fatalf("gantry %s: stderr is not a plain error:\n%s", strings.Join(args, " "), errOut)
	}
	if apiCode != "" && (!strings.Contains(errOut, "code: "+apiCode) || !regexp.MustCompile(`correlation id: \S+`).MatchString(errOut)) {
		u.t.Fatalf("gantry %s: stderr lacks code %s and a correlation id:\n%s", strings.Join(args, " "), apiCode, errOut)
	}
	return errOut
}

func (u *cliUser) profileFile() map[string]any {
	u.t.Helper()
	b, err := os.ReadFile(u.configPath())
	if err != nil {
		u.t.Fatal(err)
	}
	var f map[string]any
	if err := json.Unmarshal(b, &f); err != nil {
		u.t.Fatal(err)
	}
	return f["profiles"].(map[string]any)["default"].(map[string]any)
}

// editProfile changes fields of the default profile on disk (a clock moving on, say).
func (u *cliUser) editProfile(change func(p map[string]any)) {
	u.t.Helper()
	b, err := os.ReadFile(u.configPath())
	if err != nil {
		u.t.Fatal(err)
	}
	var f map[string]any
	if err := json.Unmarshal(b, &f); err != nil {
		u.t.Fatal(err)
	}
	change(f["profiles"].(map[string]any)["default"].(map[string]any))
	b, _ = json.Marshal(f)
	if err := os.WriteFile(u.configPath(), b, 0o600); err != nil {
		u.t.Fatal(err)
	}
}

var (
	reUUID = regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`)
	reTime = regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)`)
	reUser = regexp.MustCompile(`(adm|usr)-[0-9a-f]{8}`)
	reSlug = regexp.MustCompile(`t-[0-9a-f]{8}`)
	// The allocation's runtime user is derived from its id (alloctask.UserName).
	reAllocUser = regexp.MustCompile(`\bg[0-9a-f]{12}\b`)
	reURL       = regexp.MustCompile(`http://127\.0\.0\.1:\d+`)
	reCost      = regexp.MustCompile(`("accrued_cost": \{\s*"amount_minor": )\d+`)
	reConnJSON  = regexp.MustCompile(`"connection": \{[^}]*\}`)
	reConnYAML  = regexp.MustCompile(`(?m)^connection:\n(?:  .*\n)+`)
	reMoney     = regexp.MustCompile(`\b\d+\.\d\d USD\b`)
)

// normalize replaces what differs from run to run (ids, times, generated names, the
// server's port) with placeholders.
func normalize(s string, moneyToo bool) string {
	s = reUUID.ReplaceAllString(s, "<uuid--------------------------------->")
	s = reTime.ReplaceAllString(s, "<time>")
	s = reAllocUser.ReplaceAllString(s, "<alloc-user->")
	s = reUser.ReplaceAllString(s, "<user-----")
	s = reSlug.ReplaceAllString(s, "<slug-----")
	s = reURL.ReplaceAllString(s, "<url>")
	s = reCost.ReplaceAllString(s, "${1}<n>")
	// How to connect is the SSH work's to shape (docs/cli.md); its goldens are its own.
	s = reConnJSON.ReplaceAllString(s, `"connection": "<connection>"`)
	s = reConnYAML.ReplaceAllString(s, "connection: <connection>\n")
	if moneyToo {
		s = reMoney.ReplaceAllString(s, "<money>")
	}
	return s
}

func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", "cli", name+".golden")
	if *updateGolden {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if string(want) != got {
		t.Errorf("%s differs from %s (run with -update to accept):\n--- got ---\n%s\n--- want ---\n%s", name, path, got, want)
	}
}

// eventsStable drops the `provisioning` step from an events listing: the agent's result
// may overtake its acknowledgement and the lifecycle then goes requested -> active
// directly (docs/allocation-lifecycle.md), so that row is the one part that varies.
func eventsStable(t *testing.T, jsonOut string) string {
	t.Helper()
	var evs []map[string]any
	if err := json.Unmarshal([]byte(jsonOut), &evs); err != nil {
		t.Fatalf("events JSON: %v\n%s", err, jsonOut)
	}
	var keep []map[string]any
	for _, e := range evs {
		if e["to_status"] == "provisioning" {
			continue
		}
		if e["from_status"] == "provisioning" {
			e["from_status"] = "requested"
		}
		delete(e, "event")
		keep = append(keep, e)
	}
	b, _ := json.MarshalIndent(keep, "", "  ")
	return string(b) + "\n"
}

// cliWorld is a control plane with a node agent (process runtime) on mock H100s, a
// tenant with money, and its admin's username.
type cliWorld struct {
	c      *cp
	tenant apitest.Tenant
	agent  *exec.Cmd
}

func startCLIWorld(t *testing.T) *cliWorld {
	c := startCP(t)
	c.runBackground(c.app)
	c.catalogForAllocations()
	ctx := context.Background()
	nodeID, tok := c.newNode("gpu-cli-1")
	region := e2eRegion
	if r, err := c.client().UpdateNodeWithResponse(ctx, nodeID, &api.UpdateNodeParams{}, api.UpdateNodeJSONRequestBody{Region: &region}); err != nil || r.StatusCode() != 200 {
		t.Fatalf("node region: %v %s", err, r.Body)
	}
	e := c.enrollAgent(tok, "gpu-cli-1")
	e.cfg.Runtime = "process"
	e.cfg.StateDir = filepath.Join(filepath.Dir(e.cfg.Path), "state")
	e.cfg.AdvertiseHost = "gpu-cli-1.example"
	if err := config.Save(e.cfg.Path, e.cfg); err != nil {
		t.Fatal(err)
	}
	// The agent binary, as in TestAllocationLifecycleWithAgentProcess: it wires the
	// process runtime that runs allocations.
	var logs bytes.Buffer
	run := exec.Command(buildAgent(t), "run", "--config", e.cfg.Path)
	run.Stdout, run.Stderr = &logs, &logs
	if err := run.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = run.Process.Signal(syscall.SIGTERM)
		_ = run.Wait()
		if t.Failed() {
			t.Logf("agent log:\n%s", logs.String())
		}
	})
	eventually(t, "agent online", func() bool {
		n, ok := c.fleetNode(nodeID)
		return ok && n.Status == api.NodeStatusOnline && len(n.Gpus) == 8
	})
	tenant := c.env.NewTenant(t, c.admin, "CLI Tenant")
	if r, err := c.client().CreateBillingAdjustmentWithResponse(ctx, &api.CreateBillingAdjustmentParams{},
		api.BillingAdjustmentRequest{TenantID: tenant.ID, Amount: api.Money{AmountMinor: 1_000_000, Currency: "USD"}, Reason: "cli credit"}); err != nil || r.StatusCode() != 201 {
		t.Fatalf("credit: %v %s", err, r.Body)
	}
	return &cliWorld{c: c, tenant: tenant, agent: run}
}

// TestCLIAgainstControlPlane drives the built `gantry` binary through a user's whole path
// against a real control plane and node agent: login (wrong password, then right), the
// 0600 token file, whoami, projects, SSH keys, SKUs, alloc create --wait to active, list,
// get, events, balance, budgets, usage, transparent refresh, another tenant's allocation,
// release --wait, a revoked login, logout; with golden table and JSON output of every
// read command.
func TestCLIAgainstControlPlane(t *testing.T) {
	w := startCLIWorld(t)
	u := newCLIUser(t, w.c.url)

	// Not logged in yet.
	if errOut := u.fails(3, "", "alloc", "list"); !strings.Contains(errOut, "gantry login") {
		t.Fatalf("no login hint: %s", errOut)
	}
	// A wrong password: the API's code and correlation id, exit 3.
	if _, errOut, code := u.run("wrong password\n", "login", "-u", w.tenant.AdminUsername, "--password-stdin"); code != 3 || !strings.Contains(errOut, "code: token_invalid") || !strings.Contains(errOut, "correlation id: ") {
		t.Fatalf("wrong password: exit %d\n%s", code, errOut)
	}
	if _, errOut, code := u.run(apitest.Password+"\n", "login", "-u", w.tenant.AdminUsername, "--password-stdin"); code != 0 || !strings.Contains(errOut, "Logged in to ") {
		t.Fatalf("login: exit %d\n%s", code, errOut)
	}
	st, err := os.Stat(u.configPath())
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Fatalf("config file mode %v, want 0600", st.Mode().Perm())
	}
	raw, _ := os.ReadFile(u.configPath())
	if bytes.Contains(raw, []byte(apitest.Password)) {
		t.Fatal("the password was stored")
	}
	p := u.profileFile()
	if p["access_token"] == "" || p["refresh_token"] == nil || p["url"] != w.c.url {
		t.Fatalf("profile after login: %v", p)
	}

	var me api.UserWithBalance
	if err := json.Unmarshal([]byte(u.ok("whoami", "-o", "json")), &me); err != nil || me.Username != w.tenant.AdminUsername {
		t.Fatalf("whoami: %v %+v", err, me)
	}
	golden(t, "whoami.table", normalize(u.ok("whoami"), false))
	golden(t, "whoami.json", normalize(u.ok("whoami", "-o", "json"), false))

	// Projects: list, and use by slug.
	var projects []api.Project
	if err := json.Unmarshal([]byte(u.ok("project", "list", "-o", "json")), &projects); err != nil || len(projects) != 1 || projects[0].ID != w.tenant.DefaultProject {
		t.Fatalf("project list: %v %+v", err, projects)
	}
	u.ok("project", "use", projects[0].Slug)
	if u.profileFile()["project_id"] != w.tenant.DefaultProject.String() {
		t.Fatalf("project use did not record the project: %v", u.profileFile())
	}
	golden(t, "project-list.table", normalize(u.ok("project", "list"), false))
	golden(t, "project-list.json", normalize(u.ok("project", "list", "-o", "json"), false))
	u.fails(5, "", "project", "use", "no-such-project")

	// SSH keys: the default ~/.ssh key.
	pub, priv, _ := ed25519.GenerateKey(rand.Reader)
	sp, _ := ssh.NewPublicKey(pub)
	pemBlock, err := ssh.MarshalPrivateKey(priv, "")
	if err != nil {
		t.Fatal(err)
	}
	identity := filepath.Join(u.home, ".ssh", "id_ed25519")
	if err := os.MkdirAll(filepath.Join(u.home, ".ssh"), 0o700); err != nil {
		t.Fatal(err)
	}
	keyLine := strings.TrimSpace(string(ssh.MarshalAuthorizedKey(sp))) + " alice@laptop"
	if err := os.WriteFile(filepath.Join(u.home, ".ssh", "id_ed25519.pub"), []byte(keyLine+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(identity, pem.EncodeToMemory(pemBlock), 0o600); err != nil {
		t.Fatal(err)
	}
	u.ok("ssh-key", "add")
	var keys []api.SSHKey
	if err := json.Unmarshal([]byte(u.ok("ssh-key", "list", "-o", "json")), &keys); err != nil || len(keys) != 1 || keys[0].Name != "alice@laptop" {
		t.Fatalf("ssh-key list: %v %+v", err, keys)
	}
	fp := regexp.MustCompile(`SHA256:[A-Za-z0-9+/]+`)
	golden(t, "ssh-key-list.table", fp.ReplaceAllString(normalize(u.ok("ssh-key", "list"), false), "<fingerprint>"))
	golden(t, "ssh-key-list.yaml", fp.ReplaceAllString(regexp.MustCompile(`AAAA\S+`).ReplaceAllString(normalize(u.ok("ssh-key", "list", "-o", "yaml"), false), "<key>"), "<fingerprint>"))

	// SKUs: price per currency and free GPUs per region.
	skuTable := u.ok("sku", "list")
	if !strings.Contains(skuTable, e2eSKU) || !strings.Contains(skuTable, e2eRegion+"=8") {
		t.Fatalf("sku list:\n%s", skuTable)
	}
	golden(t, "sku-list.table", normalize(skuTable, false))
	golden(t, "sku-list.json", normalize(u.ok("sku", "list", "-o", "json"), false))

	// Launch and wait until active.
	out, errOut, code := u.run("", "alloc", "create", "--sku", e2eSKU, "--name", "train", "--wait", "-o", "json")
	if code != 0 {
		t.Fatalf("alloc create --wait: exit %d\n%s\n%s", code, out, errOut)
	}
	var alloc api.Allocation
	if err := json.Unmarshal([]byte(out), &alloc); err != nil || alloc.Status != api.V3WorkloadStatusActive || alloc.Name != "train" {
		t.Fatalf("alloc create --wait: %v %+v", err, alloc)
	}
	if !strings.Contains(errOut, "train "+alloc.ID.String()+": active") {
		t.Fatalf("no status lines while waiting:\n%s", errOut)
	}

	golden(t, "alloc-list.table", normalize(u.ok("alloc", "list"), true))
	golden(t, "alloc-list.json", normalize(u.ok("alloc", "list", "-o", "json"), false))
	golden(t, "alloc-get.table", normalize(u.ok("alloc", "get", "train"), true))
	golden(t, "alloc-get.yaml", normalize(u.ok("alloc", "get", alloc.ID.String(), "-o", "yaml"), false))
	golden(t, "alloc-events.json", normalize(eventsStable(t, u.ok("alloc", "events", "train", "-o", "json")), false))
	evTable := u.ok("alloc", "events", "train")
	if !strings.Contains(evTable, "requested") || !regexp.MustCompile(`(?m)\s+active\s+`).MatchString(evTable) {
		t.Fatalf("events table:\n%s", evTable)
	}

	// The terminal: output comes back, and the shell's exit status is the command's.
	if out, errOut, code := u.run("", "terminal", "train", "--", "echo", "cli-$((6*7))"); code != 0 || !strings.Contains(out, "cli-42") {
		t.Fatalf("terminal echo: exit %d\n%s\n%s", code, out, errOut)
	}
	if _, errOut, code := u.run("", "terminal", "train", "--", "exit", "7"); code != 7 {
		t.Fatalf("terminal exit status: %d, want 7\n%s", code, errOut)
	}

	// ssh-config: a block `ssh -G` accepts, naming the allocation through gantry ssh-proxy.
	cfgFile := filepath.Join(u.home, "gantry.sshconfig")
	if err := os.WriteFile(cfgFile, []byte(u.ok("ssh-config")), 0o600); err != nil {
		t.Fatal(err)
	}
	g, err := exec.Command("ssh", "-G", "-F", cfgFile, "gantry-train").CombinedOutput()
	if err != nil {
		t.Fatalf("ssh -G: %v\n%s", err, g)
	}
	for _, want := range []string{"hostname " + alloc.ID.String(), "user " + alloc.Connection.User, "hostkeyalias gantry-" + alloc.ID.String(),
		"proxycommand " + u.bin + " ssh-proxy --project " + w.tenant.DefaultProject.String() + " %h"} {
		if !strings.Contains(string(g), want+"\n") {
			t.Fatalf("ssh -G lacks %q:\n%s", want, g)
		}
	}
	// gantry ssh: the system ssh through gantry ssh-proxy and the node tunnel, with the
	// remote command's exit status.
	if out, errOut, code := u.run("", "ssh", "train", "-i", identity, "--ssh-arg=-oUserKnownHostsFile="+filepath.Join(u.home, "known_hosts"), "--", "echo ssh-$((6*7)); exit 3"); code != 3 || !strings.Contains(out, "ssh-42") {
		t.Fatalf("gantry ssh: exit %d\n%s\n%s", code, out, errOut)
	}

	golden(t, "balance.table", normalize(u.ok("balance"), false))
	golden(t, "balance.json", normalize(u.ok("balance", "-o", "json"), false))
	u.ok("budget", "create", "--name", "monthly-cap", "--amount", "250.00", "--currency", "USD", "--period", "monthly", "--scope", "project")
	u.fails(2, "", "budget", "create", "--amount", "1.234", "--currency", "USD")
	golden(t, "budget-list.table", normalize(u.ok("budget", "list"), false))
	golden(t, "budget-list.json", normalize(u.ok("budget", "list", "-o", "json"), false))
	var usage []api.BillingRatedUsageLine
	if err := json.Unmarshal([]byte(u.ok("usage", "-o", "json")), &usage); err != nil {
		t.Fatalf("usage: %v", err)
	}
	if !strings.HasPrefix(u.ok("usage"), "FROM") {
		t.Fatal("usage table has no header")
	}

	// Transparent refresh: the stored access token has run out (as after 15 minutes).
	before := u.profileFile()
	u.editProfile(func(p map[string]any) {
		p["access_expires_at"] = time.Now().Add(-time.Minute).UTC().Format(time.RFC3339)
	})
	u.ok("alloc", "get", "train")
	after := u.profileFile()
	if after["access_token"] == before["access_token"] || after["refresh_token"] == before["refresh_token"] {
		t.Fatal("an expired access token was not refreshed (and the refresh token rotated)")
	}

	// Another tenant's allocation is not found, with the API's code.
	other := w.c.env.NewTenant(t, w.c.admin, "Other Tenant")
	ou := newCLIUser(t, w.c.url)
	if _, e, code := ou.run(apitest.Password+"\n", "login", "-u", other.AdminUsername, "--password-stdin"); code != 0 {
		t.Fatalf("other login: %s", e)
	}
	ou.fails(5, "allocation_not_found", "alloc", "get", alloc.ID.String())
	ou.fails(5, "allocation_not_found", "alloc", "release", alloc.ID.String())

	// Release and wait; a second release says the allocation is not active.
	out, errOut, code = u.run("", "alloc", "release", "train", "--wait", "-o", "json")
	if code != 0 || !strings.Contains(out, `"status": "released"`) {
		t.Fatalf("release --wait: exit %d\n%s\n%s", code, out, errOut)
	}
	if _, errOut, code := u.run("", "alloc", "release", alloc.ID.String()); code != 0 || !strings.Contains(errOut, "is already released") {
		t.Fatalf("second release: exit %d\n%s", code, errOut)
	}
	// A command that needs an active allocation refuses a released one with its code.
	u.fails(6, "allocation_not_active", "terminal", "train")

	// Ctrl-C while waiting: the agent is frozen (SIGSTOP) so the launch stays requested;
	// SIGINT stops the wait with exit 130 and leaves the allocation as it is.
	if err := w.agent.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	thawed := false
	thaw := func() {
		if !thawed {
			thawed = true
			_ = w.agent.Process.Signal(syscall.SIGCONT)
		}
	}
	t.Cleanup(thaw)
	wait := exec.Command(u.bin, "alloc", "create", "--sku", e2eSKU, "--name", "paused", "--wait")
	wait.Env = u.env()
	stderr, err := wait.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := wait.Start(); err != nil {
		t.Fatal(err)
	}
	var waitErr bytes.Buffer
	line := make([]byte, 1)
	for !strings.Contains(waitErr.String(), ": requested\n") {
		if _, err := stderr.Read(line); err != nil {
			t.Fatalf("gantry alloc create --wait ended before waiting: %v\n%s", err, waitErr.String())
		}
		waitErr.Write(line)
	}
	if err := wait.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	rest, _ := io.ReadAll(stderr)
	waitErr.Write(rest)
	err = wait.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 130 || !strings.Contains(waitErr.String(), "Stopped waiting: allocation ") {
		t.Fatalf("Ctrl-C during --wait: %v\n%s", err, waitErr.String())
	}
	var paused []api.Allocation
	if err := json.Unmarshal([]byte(u.ok("alloc", "list", "--live", "-o", "json")), &paused); err != nil || len(paused) != 1 || paused[0].Name != "paused" {
		t.Fatalf("after Ctrl-C the allocation should still be there: %v %+v", err, paused)
	}
	thaw()
	if out, errOut, code := u.run("", "alloc", "release", "paused", "--wait"); code != 0 {
		t.Fatalf("release paused: exit %d\n%s\n%s", code, out, errOut)
	}

	// A revoked login: the refresh token is revoked elsewhere and the access token runs
	// out; the next command gives the re-login hint and exit 3, not a stack trace.
	refresh := u.profileFile()["refresh_token"].(string)
	if r, err := w.c.env.Client(w.tenant.AdminToken).LogoutWithResponse(context.Background(), &api.LogoutParams{}, api.LogoutJSONRequestBody{RefreshToken: refresh}); err != nil || r.StatusCode() != 204 {
		t.Fatalf("revoke: %v %s", err, r.Body)
	}
	u.editProfile(func(p map[string]any) {
		p["access_expires_at"] = time.Now().Add(-time.Minute).UTC().Format(time.RFC3339)
	})
	errOut = u.fails(3, "", "alloc", "list")
	if !strings.Contains(errOut, "expired or was revoked") || !strings.Contains(errOut, "Hint: run `gantry login`") {
		t.Fatalf("revoked login:\n%s", errOut)
	}

	// Log in again, then log out: the tokens are gone and the refresh token is revoked.
	if _, e, code := u.run(apitest.Password+"\n", "login", "--password-stdin"); code != 0 {
		t.Fatalf("login again: %s", e)
	}
	refresh = u.profileFile()["refresh_token"].(string)
	u.ok("logout")
	if p := u.profileFile(); p["access_token"] != nil || p["refresh_token"] != nil || p["url"] != w.c.url {
		t.Fatalf("profile after logout: %v", p)
	}
	if r, err := w.c.env.Client("").RefreshTokenWithResponse(context.Background(), &api.RefreshTokenParams{}, api.RefreshTokenJSONRequestBody{RefreshToken: refresh}); err != nil || r.StatusCode() != 401 {
		t.Fatalf("refresh after logout: %v %d", err, r.StatusCode())
	}
	u.fails(3, "", "whoami")
}

// TestCLIServiceAccountLogin signs in with a service account's client credentials,
// reads through the project it is a member of, and renews its token after it runs out
// (there is no refresh token: the stored credential is traded again).
func TestCLIServiceAccountLogin(t *testing.T) {
	c := startCP(t)
	c.catalogForAllocations()
	tenant := c.env.NewTenant(t, c.admin, "Machines")
	ctx := context.Background()
	admin := c.env.Client(tenant.AdminToken)
	sa, err := admin.CreateServiceAccountWithResponse(ctx, &api.CreateServiceAccountParams{}, api.CreateServiceAccountRequest{
		Name: "ci", ProjectRoles: []api.ServiceAccountProjectRole{{ProjectID: tenant.DefaultProject, Role: api.MachineProjectRoleMember}}})
	if err != nil || sa.JSON201 == nil {
		t.Fatalf("service account: %v %s", err, sa.Body)
	}
	cred, err := admin.CreateServiceAccountCredentialWithResponse(ctx, sa.JSON201.ID, &api.CreateServiceAccountCredentialParams{}, api.CreateAccessCredentialRequest{Name: "cli"})
	if err != nil || cred.JSON201 == nil {
		t.Fatalf("credential: %v %s", err, cred.Body)
	}
	u := newCLIUser(t, c.url)
	u.fails(3, "invalid_client", "login", "--client-id", cred.JSON201.ClientID, "--client-secret", "wrong")
	u.ok("login", "--client-id", cred.JSON201.ClientID, "--client-secret", cred.JSON201.ClientSecret)
	if st, err := os.Stat(u.configPath()); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("config file: %v %v", err, st)
	}
	list := u.ok("alloc", "list", "--project", tenant.DefaultProject.String(), "-o", "json")
	if strings.TrimSpace(list) != "[]" {
		t.Fatalf("alloc list: %s", list)
	}
	first := u.profileFile()["access_token"]
	u.editProfile(func(p map[string]any) {
		p["access_expires_at"] = time.Now().Add(-time.Minute).UTC().Format(time.RFC3339)
	})
	u.ok("sku", "list")
	if u.profileFile()["access_token"] == first {
		t.Fatal("the service account's token was not renewed")
	}
}

// TestCLILoginWithTOTP: an account with TOTP needs its second factor; without a terminal
// the CLI does not prompt but says to pass --totp (exit 3, the API's reason), a wrong
// code is refused, and a recovery code signs in.
func TestCLILoginWithTOTP(t *testing.T) {
	c := startCP(t)
	tenant := c.env.NewTenant(t, c.admin, "MFA")
	en := c.env.Call(t, "POST", "/api/v1/account/security/mfa/totp", tenant.AdminToken, nil, "")
	secret := en.Str("secret")
	if secret == "" {
		t.Fatalf("enrol: %v", en.Body)
	}
	v := c.env.Call(t, "POST", "/api/v1/account/security/mfa/totp/verify", tenant.AdminToken,
		map[string]string{"totp_code": apitest.Oathtool(t, secret, time.Now())}, "")
	codes, _ := v.Body["recovery_codes"].([]any)
	if len(codes) == 0 {
		t.Fatalf("verify: %v", v.Body)
	}
	u := newCLIUser(t, c.url)
	_, errOut, code := u.run(apitest.Password+"\n", "login", "-u", tenant.AdminUsername, "--password-stdin")
	if code != 3 || !strings.Contains(errOut, "(mfa_required)") || !strings.Contains(errOut, "code: token_invalid") || !strings.Contains(errOut, "pass --totp") {
		t.Fatalf("login without the second factor: exit %d\n%s", code, errOut)
	}
	if _, errOut, code := u.run(apitest.Password+"\n", "login", "-u", tenant.AdminUsername, "--password-stdin", "--totp", "000000"); code != 3 || !strings.Contains(errOut, "totp_") {
		t.Fatalf("wrong TOTP code: exit %d\n%s", code, errOut)
	}
	if _, errOut, code := u.run(apitest.Password+"\n", "login", "-u", tenant.AdminUsername, "--password-stdin", "--recovery-code", codes[0].(string)); code != 0 {
		t.Fatalf("login with a recovery code: exit %d\n%s", code, errOut)
	}
	if !strings.Contains(u.ok("whoami"), tenant.AdminUsername) {
		t.Fatal("whoami after the MFA login")
	}
}
