package packages_test

import (
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"github.com/gantry-gpu/gantry/controlplane/internal/apitest"
	"github.com/gantry-gpu/gantry/controlplane/internal/app"
	"github.com/gantry-gpu/gantry/shared/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// TestThroughTheAPI serves the package through the control plane's router: public (no
// bearer: a machine being deployed has none), answers validated against the contract
// by apitest's transport, and 503 service_unavailable without a configured package.
func TestThroughTheAPI(t *testing.T) {
	p := filepath.Join(t.TempDir(), "gantry-nodeagent_1.2.3_amd64.deb")
	pkg := []byte("!<arch>\nnot really a deb, but bytes are bytes")
	if err := os.WriteFile(p, pkg, 0o644); err != nil {
		t.Fatal(err)
	}
	env := apitest.New(t, apitest.WithConfig(func(c *app.Config) { c.Maas.PackagePath = p }))
	get := func(env *apitest.Env, path string) (*http.Response, []byte) {
		t.Helper()
		res := env.Do(env.Request(http.MethodGet, path, "", ""))
		defer res.Body.Close()
		b, err := io.ReadAll(res.Body)
		if err != nil {
			t.Fatal(err)
		}
		return res, b
	}
	res, body := get(env, "/api/v1/node-agent/package")
	if res.StatusCode != 200 || string(body) != string(pkg) || res.Header.Get("Content-Type") != "application/vnd.debian.binary-package" {
		t.Fatalf("package: %d %q %v", res.StatusCode, body, res.Header)
	}
	sum := sha256.Sum256(pkg)
	res, body = get(env, "/api/v1/node-agent/package.sha256")
	if want := hex.EncodeToString(sum[:]) + "  gantry-nodeagent_1.2.3_amd64.deb\n"; res.StatusCode != 200 || string(body) != want {
		t.Fatalf("checksum: %d %q, want %q", res.StatusCode, body, want)
	}

	bare := apitest.New(t)
	for _, path := range []string{"/api/v1/node-agent/package", "/api/v1/node-agent/package.sha256"} {
		a := bare.Send(t, bare.Request(http.MethodGet, path, "", ""))
		if a.Status != http.StatusServiceUnavailable || a.Code() != "service_unavailable" {
			t.Errorf("%s without a package: %d %s", path, a.Status, a.Raw)
		}
	}
}
