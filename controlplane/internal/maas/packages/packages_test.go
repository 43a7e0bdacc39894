package packages

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/gantry-gpu/gantry/proto/api"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

func get(t *testing.T, h *Handlers) (*httptest.ResponseRecorder, *httptest.ResponseRecorder) {
	t.Helper()
	ctx := context.Background()
	pkg, sum := httptest.NewRecorder(), httptest.NewRecorder()
	r1, err := h.GetNodeAgentPackage(ctx, api.GetNodeAgentPackageRequestObject{})
	if err != nil {
		t.Fatal(err)
	}
	if err := r1.VisitGetNodeAgentPackageResponse(pkg); err != nil {
		t.Fatal(err)
	}
	r2, err := h.GetNodeAgentPackageChecksum(ctx, api.GetNodeAgentPackageChecksumRequestObject{})
	if err != nil {
		t.Fatal(err)
	}
	if err := r2.VisitGetNodeAgentPackageChecksumResponse(sum); err != nil {
		t.Fatal(err)
	}
	return pkg, sum
}

func sha(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }

func TestServesPackageAndChecksum(t *testing.T) {
	p := filepath.Join(t.TempDir(), "gantry-nodeagent_1.0.0_amd64.deb")
	first := []byte("!<arch>\nfirst package bytes")
	if err := os.WriteFile(p, first, 0o644); err != nil {
		t.Fatal(err)
	}
	h := New(p)
	pkg, sum := get(t, h)
	if pkg.Code != 200 || pkg.Body.String() != string(first) || pkg.Header().Get("Content-Type") != "application/vnd.debian.binary-package" ||
		pkg.Header().Get("Content-Length") != "27" {
		t.Fatalf("package: %d %q %v", pkg.Code, pkg.Body, pkg.Header())
	}
	if want := sha(first) + "  gantry-nodeagent_1.0.0_amd64.deb\n"; sum.Code != 200 || sum.Body.String() != want {
		t.Fatalf("checksum %d %q, want %q", sum.Code, sum.Body, want)
	}

	// An operator installs a new package in place: both answers follow it.
	second := []byte("!<arch>\nthe second, longer package")
	if err := os.WriteFile(p, second, 0o644); err != nil {
		t.Fatal(err)
	}
	later := time.Now().Add(time.Minute)
	if err := os.Chtimes(p, later, later); err != nil {
		t.Fatal(err)
	}
	pkg, sum = get(t, h)
	if pkg.Body.String() != string(second) || sum.Body.String() != sha(second)+"  gantry-nodeagent_1.0.0_amd64.deb\n" {
		t.Fatalf("after replacing the file: %q / %q", pkg.Body, sum.Body)
	}
}

func TestUnavailable(t *testing.T) {
	dir := t.TempDir()
	for name, h := range map[string]*Handlers{
		"not configured": New(""),
		"missing file":   New(filepath.Join(dir, "nope.deb")),
		"directory":      New(dir),
	} {
		_, err := h.GetNodeAgentPackage(context.Background(), api.GetNodeAgentPackageRequestObject{})
		_, err2 := h.GetNodeAgentPackageChecksum(context.Background(), api.GetNodeAgentPackageChecksumRequestObject{})
		for _, e := range []error{err, err2} {
			if apierr.CodeOf(e) != apierr.ServiceUnavailable {
				t.Errorf("%s: %v, want service_unavailable", name, e)
			} else if ae, _ := apierr.As(e); ae.HTTPStatus() != http.StatusServiceUnavailable {
				t.Errorf("%s: status %d", name, ae.HTTPStatus())
			}
		}
	}
}
