package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestDevMaasOffByDefault(t *testing.T) {
	t.Setenv("GANTRY_DEV_MAAS", "")
	dir := t.TempDir()
	var notes []string
	startDevMaas(context.Background(), dir, func(f string, a ...any) { notes = append(notes, f) })()
	if len(notes) != 0 {
		t.Fatalf("notes without GANTRY_DEV_MAAS: %v", notes)
	}
	if _, err := os.Stat(filepath.Join(dir, "maas")); !os.IsNotExist(err) {
		t.Fatalf("created %s/maas without GANTRY_DEV_MAAS (%v)", dir, err)
	}
}

func TestDevMaasKeyPersists(t *testing.T) {
	p := filepath.Join(t.TempDir(), "api-key")
	k1, err := devMaasKey(p)
	if err != nil || strings.Count(k1, ":") != 2 {
		t.Fatalf("first key %q: %v", k1, err)
	}
	if st, err := os.Stat(p); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("key file mode: %v %v", st, err)
	}
	k2, err := devMaasKey(p)
	if err != nil || k2 != k1 {
		t.Fatalf("second start got %q, want the stored %q (%v)", k2, k1, err)
	}
	if err := os.WriteFile(p, []byte("garbage\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if k3, _ := devMaasKey(p); k3 == "garbage" || strings.Count(k3, ":") != 2 {
		t.Fatalf("a malformed stored key was used: %q", k3)
	}
	seen := map[string]bool{}
	for _, m := range devMaasMachines {
		if seen[m.SystemID] || len(m.SystemID) != 6 {
			t.Fatalf("dev machine system ids must be unique 6-character ids: %v", m.SystemID)
		}
		seen[m.SystemID] = true
	}
}
