package runtime

import (
	"context"
	"testing"

	"github.com/gantry-gpu/gantry/shared/alloctask"
)

// Stop and release tell OnInactive (the terminal server) after the new phase is saved:
// the session lookup already refuses the allocation when the notice arrives.
func TestOnInactiveIsToldOnStopAndRelease(t *testing.T) {
	ctx := context.Background()
	mock := mockGPUs(t)
	rt := newProcessRuntime(t, t.TempDir(), mock)
	p := payload(t, inventory(t, mock), 0)
	var told []string
	rt.NotifyInactive(func(id, kind string) {
		if _, live := rt.Session(id); live {
			t.Errorf("%s: Session still answers for %s when OnInactive runs", kind, id)
		}
		told = append(told, kind)
	})
	if _, err := rt.Provision(ctx, p); err != nil {
		t.Fatal(err)
	}
	if err := rt.Stop(ctx, p); err != nil {
		t.Fatal(err)
	}
	if err := rt.Release(ctx, p); err != nil {
		t.Fatal(err)
	}
	if len(told) != 2 || told[0] != alloctask.KindStop || told[1] != alloctask.KindRelease {
		t.Fatalf("OnInactive told %q, want stop then release", told)
	}
}
