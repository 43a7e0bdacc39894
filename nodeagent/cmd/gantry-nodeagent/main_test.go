package main

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func execute(t *testing.T, args ...string) (string, error) {
	t.Helper()
	root := newRoot()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(args)
	err := root.Execute()
	return out.String(), err
}

func TestGPUCommandOnMock(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "none.conf")
	out, err := execute(t, "gpu", "--config", cfg, "--gpu-backend", "mock-h200", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		Backend   string
		Inventory struct {
			GPUs []struct {
				Model string
				UUID  string
			}
		}
		Samples []struct{ Healthy bool }
	}
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if v.Backend != "mock-h200" || len(v.Inventory.GPUs) != 8 || v.Inventory.GPUs[0].Model != "NVIDIA H200 141GB HBM3e" || len(v.Samples) != 8 || !v.Samples[0].Healthy {
		t.Fatalf("%+v", v)
	}
	table, err := execute(t, "gpu", "--config", cfg, "--gpu-backend", "mock-h100")
	if err != nil || !strings.Contains(table, "8 GPU(s)") || strings.Count(table, "NVIDIA H100 80GB HBM3") != 8 {
		t.Fatalf("%v\n%s", err, table)
	}
}

func TestRunWithoutEnrollmentSaysSo(t *testing.T) {
	_, err := execute(t, "run", "--config", filepath.Join(t.TempDir(), "nodeagent.conf"))
	if err == nil || !strings.Contains(err.Error(), "enroll this host first") {
		t.Fatalf("err = %v", err)
	}
}

func TestEnrollRequiresServerAndToken(t *testing.T) {
	t.Setenv(EnvEnrollmentToken, "")
	if _, err := execute(t, "enroll", "--config", filepath.Join(t.TempDir(), "c.conf"), "--server", "http://x"); err == nil {
		t.Fatal("enroll without a token accepted")
	}
}

func TestEnrollDoesNotFollowRedirects(t *testing.T) {
	var followed bool
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { followed = true }))
	defer target.Close()
	redirect := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, target.URL+r.URL.Path, http.StatusTemporaryRedirect)
	}))
	defer redirect.Close()
	t.Setenv(EnvEnrollmentToken, "get_secret")
	_, err := execute(t, "enroll", "--config", filepath.Join(t.TempDir(), "c.conf"), "--server", redirect.URL)
	if err == nil || followed {
		t.Fatalf("redirect followed=%v err=%v", followed, err)
	}
}

func TestRunRuntimeFlagIsValidated(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "nodeagent.conf")
	if err := os.WriteFile(cfg, []byte("node_id = 0190f6a0-0000-7000-8000-000000000001\nfabric_addr = 127.0.0.1:1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := execute(t, "run", "--config", cfg, "--gpu-backend", "mock-h100", "--runtime", "docker")
	if err == nil || !strings.Contains(err.Error(), `runtime "docker" is not auto, process or linux-user`) {
		t.Fatalf("err = %v", err)
	}
}
