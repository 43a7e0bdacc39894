package profile

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestSaveIs0600AndRoundTrips: the file holding tokens is never readable by others,
// also when it existed before with wider permissions, and reads back what was saved.
func TestSaveIs0600AndRoundTrips(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "gantry")
	s := Store{Path: filepath.Join(dir, "config.json")}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(s.Path, []byte(`{"profiles":{}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := s.Load()
	if err != nil {
		t.Fatal(err)
	}
	exp := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	p := f.Get("staging")
	*p = Profile{URL: "https://cp.example", AccessToken: "a", RefreshToken: "r", AccessExpiresAt: exp, ProjectID: "p1"}
	f.Current = "staging"
	if err := s.Save(f); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(s.Path)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v, err %v; want 0600", st.Mode().Perm(), err)
	}
	g, err := s.Load()
	if err != nil {
		t.Fatal(err)
	}
	got := g.Profiles["staging"]
	if g.Current != "staging" || got.AccessToken != "a" || got.RefreshToken != "r" || !got.AccessExpiresAt.Equal(exp) {
		t.Fatalf("read back %+v", got)
	}
	got.ClearLogin()
	if got.LoggedIn() || got.RefreshToken != "" || got.URL != "https://cp.example" || got.ProjectID != "p1" {
		t.Fatalf("after ClearLogin: %+v", got)
	}
}

func TestLoadRejectsGarbage(t *testing.T) {
	s := Store{Path: filepath.Join(t.TempDir(), "config.json")}
	if err := os.WriteFile(s.Path, []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Load(); err == nil {
		t.Fatal("garbage config loaded")
	}
	missing := Store{Path: filepath.Join(t.TempDir(), "none", "config.json")}
	f, err := missing.Load()
	if err != nil || len(f.Profiles) != 0 {
		t.Fatalf("missing file: %v %+v", err, f)
	}
}
