package enroll

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"math/big"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gantry-gpu/gantry/nodeagent/config"
)

func caPEM(t *testing.T) string {
	t.Helper()
	k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "fabric CA"}, IsCA: true, BasicConstraintsValid: true,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tpl, tpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
}

func TestCallAndApply(t *testing.T) {
	ca := caPEM(t)
	var got Request
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != Path || r.Header.Get("Content-Type") != "application/json" || r.Header.Get("Authorization") != "" {
			t.Errorf("request %s %s %v", r.Method, r.URL.Path, r.Header)
		}
		_ = json.NewDecoder(r.Body).Decode(&got)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(Response{NodeID: "0190f6a0-0000-7000-8000-000000000001", NodeToken: "gnt_secret", FabricCAPEM: ca, FabricAddr: "cp.example:7443"})
	}))
	defer srv.Close()
	res, err := Call(context.Background(), srv.Client(), srv.URL+"/", Request{EnrollmentToken: "get_one", Hostname: "gpu-01", AgentVersion: "1.0"})
	if err != nil {
		t.Fatal(err)
	}
	if got != (Request{EnrollmentToken: "get_one", Hostname: "gpu-01", AgentVersion: "1.0"}) {
		t.Fatalf("request body %+v", got)
	}
	dir := t.TempDir()
	cfg := config.Default()
	cfg.Path = filepath.Join(dir, "etc", "nodeagent.conf")
	cfg.GPUBackend = "mock-h100"
	cfg, err = Apply(cfg, srv.URL+"/", res)
	if err != nil {
		t.Fatal(err)
	}
	loaded, err := config.Load(cfg.Path, false, func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	if loaded.NodeID != res.NodeID || loaded.FabricAddr != "cp.example:7443" || loaded.ServerURL != srv.URL || loaded.GPUBackend != "mock-h100" {
		t.Fatalf("config %+v", loaded)
	}
	if tok, err := loaded.ReadToken(); err != nil || tok != "gnt_secret" {
		t.Fatalf("token %q %v", tok, err)
	}
	if _, err := loaded.TLSConfig(); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(cfg.Path)
	if strings.Contains(string(b), "gnt_secret") {
		t.Fatal("token written into the config file")
	}
}

func TestCallRefusals(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUnauthorized)
		_, _ = w.Write([]byte(`{"code":"token_expired","message":"the enrollment token expired","correlation_id":"x"}`))
	}))
	defer srv.Close()
	_, err := Call(context.Background(), srv.Client(), srv.URL, Request{EnrollmentToken: "t", Hostname: "h", AgentVersion: "v"})
	var e *Error
	if !errors.As(err, &e) || e.Status != 401 || e.Code != "token_expired" {
		t.Fatalf("err = %v", err)
	}
	if strings.Contains(err.Error(), "t\"") {
		t.Fatal("token in error")
	}

	for name, req := range map[string]Request{
		"no token":      {Hostname: "h", AgentVersion: "v"},
		"long token":    {EnrollmentToken: strings.Repeat("t", 257), Hostname: "h", AgentVersion: "v"},
		"no hostname":   {EnrollmentToken: "t", AgentVersion: "v"},
		"long hostname": {EnrollmentToken: "t", Hostname: strings.Repeat("h", 254), AgentVersion: "v"},
		"long version":  {EnrollmentToken: "t", Hostname: "h", AgentVersion: strings.Repeat("v", 65)},
	} {
		if _, err := Call(context.Background(), srv.Client(), srv.URL, req); err == nil || errors.As(err, &e) && e.Code != "token_expired" {
			t.Errorf("%s: err = %v", name, err)
		}
	}
	if _, err := Call(context.Background(), nil, "ftp://x", Request{EnrollmentToken: "t", Hostname: "h", AgentVersion: "v"}); err == nil {
		t.Error("ftp URL accepted")
	}
}

func TestCallIncompleteResponse(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"node_id":"n","node_token":"gnt_x","fabric_ca_pem":"","fabric_addr":""}`))
	}))
	defer srv.Close()
	if _, err := Call(context.Background(), srv.Client(), srv.URL, Request{EnrollmentToken: "t", Hostname: "h", AgentVersion: "v"}); err == nil || !strings.Contains(err.Error(), "fabric") {
		t.Fatalf("err = %v", err)
	}
}
