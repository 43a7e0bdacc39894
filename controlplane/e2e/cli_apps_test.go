package e2e_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/gantry-gpu/gantry/controlplane/internal/apitest"
	"github.com/gantry-gpu/gantry/proto/api"
)

// TestCLIApps drives the app commands through the built gantry binary against a control
// plane and a real node agent (process runtime): the catalog shows the entitled app,
// `app launch --wait` runs python3's http.server on an allocation until it is running,
// `app open` mints the single-use link that a browser (a cookie jar here) follows through
// the app proxy to the app's page, `app list`/`get` show it, and `app stop --wait` ends it.
// An unknown app is exit 5 with app_not_found.
func TestCLIApps(t *testing.T) {
	w := startCLIWorld(t)
	ctx := context.Background()
	// The app pieces app.Run would run: the instances' reconcile pass (start and stop
	// tasks to the agent), and the proxy in front of the API.
	bg, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { w.c.app.Instances.Run(bg); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	front := httptest.NewServer(w.c.app.AppProxy.Mount(w.c.app.Handler))
	t.Cleanup(front.Close)

	// The catalog: one app served by python3 -m http.server, entitled to this tenant.
	health, start := "/", 60
	if r, err := w.c.client().CreateAppWithResponse(ctx, &api.CreateAppParams{}, api.CreateAppJSONRequestBody{
		Slug: "hello", Name: "Hello files", Kind: api.V3WorkloadKindApp,
		Versions: []api.AppVersionSpec{{
			Version: "1", Port: 28181,
			Command:     []string{"python3", "-m", "http.server", "{port}", "--bind", "127.0.0.1", "--directory", "{home}"},
			HealthCheck: api.AppHealthCheckSpec{Type: api.AppHealthCheckTypeHTTP, Path: &health, StartupTimeoutSeconds: &start},
		}},
	}); err != nil || r.StatusCode() != 201 {
		t.Fatalf("create app: %v %s", err, r.Body)
	}
	tenantID := w.tenant.ID
	if r, err := w.c.client().CreateAppEntitlementWithResponse(ctx, "hello", &api.CreateAppEntitlementParams{},
		api.CreateAppEntitlementJSONRequestBody{TenantID: &tenantID}); err != nil || r.StatusCode() != 201 {
		t.Fatalf("entitle: %v %s", err, r.Body)
	}

	u := newCLIUser(t, front.URL)
	if _, errOut, code := u.run(apitest.Password+"\n", "login", "-u", w.tenant.AdminUsername, "--password-stdin"); code != 0 {
		t.Fatalf("login: exit %d\n%s", code, errOut)
	}
	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	sp, err := ssh.NewPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	pubFile := filepath.Join(u.home, "apps.pub")
	if err := os.WriteFile(pubFile, ssh.MarshalAuthorizedKey(sp), 0o644); err != nil {
		t.Fatal(err)
	}
	u.ok("ssh-key", "add", pubFile)
	if out, errOut, code := u.run("", "alloc", "create", "--sku", e2eSKU, "--name", "host", "--wait"); code != 0 {
		t.Fatalf("alloc create --wait: exit %d\n%s\n%s", code, out, errOut)
	}

	var catalog []api.App
	if err := json.Unmarshal([]byte(u.ok("app", "catalog", "-o", "json")), &catalog); err != nil || len(catalog) != 1 ||
		catalog[0].Slug != "hello" || !catalog[0].Entitled || catalog[0].LatestVersion == nil || *catalog[0].LatestVersion != "1" {
		t.Fatalf("catalog: %v %+v", err, catalog)
	}
	if table := u.ok("app", "catalog"); !strings.Contains(table, "hello") || !strings.Contains(table, "yes") {
		t.Fatalf("catalog table:\n%s", table)
	}
	if errOut := u.fails(5, "app_not_found", "app", "launch", "nope", "--version", "1", "--alloc", "host"); errOut == "" {
		t.Fatal("no error for an unknown app")
	}
	if _, errOut, code := u.run("", "app", "launch", "hello", "--alloc", "host", "--sku", e2eSKU); code != 2 || !strings.Contains(errOut, "exactly one of --alloc and --sku") {
		t.Fatalf("both --alloc and --sku: exit %d\n%s", code, errOut)
	}

	out, errOut, code := u.run("", "app", "launch", "hello", "--alloc", "host", "--name", "files", "--wait", "-o", "json")
	if code != 0 {
		t.Fatalf("app launch --wait: exit %d\n%s\n%s", code, out, errOut)
	}
	var inst api.AppInstance
	if err := json.Unmarshal([]byte(out), &inst); err != nil || inst.State != api.AppInstanceStateRunning || inst.Version != "1" {
		t.Fatalf("launched: %v %+v", err, inst)
	}
	if !strings.Contains(errOut, "files "+inst.ID.String()+": running") {
		t.Fatalf("no progress lines:\n%s", errOut)
	}
	var listed []api.AppInstance
	if err := json.Unmarshal([]byte(u.ok("app", "list", "-o", "json")), &listed); err != nil || len(listed) != 1 || listed[0].ID != inst.ID {
		t.Fatalf("app list: %v %+v", err, listed)
	}
	if got := u.ok("app", "get", "files"); !strings.Contains(got, "running") || !strings.Contains(got, inst.ProxyPath) {
		t.Fatalf("app get:\n%s", got)
	}

	// The browser's side: the link signs in once, sets the instance's cookie and lands
	// on the app's page.
	var link struct {
		URL string `json:"url"`
	}
	if err := json.Unmarshal([]byte(u.ok("app", "open", "files", "--no-browser", "-o", "json")), &link); err != nil || !strings.HasPrefix(link.URL, front.URL+"/api/v1/app-proxy/"+inst.ID.String()+"/") {
		t.Fatalf("app open: %v %q", err, link.URL)
	}
	jar, _ := cookiejar.New(nil)
	browser := &http.Client{Jar: jar, Timeout: 30 * time.Second}
	resp, err := browser.Get(link.URL)
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(page), "Directory listing") {
		t.Fatalf("through the proxy: %d\n%s", resp.StatusCode, page)
	}
	// The link was single-use: a second browser gets no cookie from it.
	again, err := (&http.Client{Timeout: 30 * time.Second}).Get(link.URL)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, again.Body)
	again.Body.Close()
	if again.StatusCode == 200 {
		t.Fatal("the link opened the app twice")
	}

	out = u.ok("app", "stop", "files", "--wait", "-o", "json")
	if err := json.Unmarshal([]byte(out), &inst); err != nil || inst.State != api.AppInstanceStateStopped {
		t.Fatalf("app stop --wait: %v %s", err, out)
	}
	if live := u.ok("app", "list", "--live", "-o", "json"); strings.TrimSpace(live) != "[]" {
		t.Fatalf("app list --live after stop: %s", live)
	}
}
