package terminal

import (
	"slices"
	"testing"

	"github.com/gantry-gpu/gantry/nodeagent/runtime"
)

type lookup map[string]runtime.SessionEnv

func (l lookup) Session(id string) (runtime.SessionEnv, bool) {
	s, ok := l[id]
	return s, ok
}

func TestRuntimeEnvironments(t *testing.T) {
	rt := lookup{"a": {
		AllocationID: "a", User: "gantry-a", RealUser: true, UID: 1001, GID: 1002, Dir: "/home/gantry/a",
		Shell: "/bin/bash", Env: []string{"HOME=/home/gantry/a", "CUDA_VISIBLE_DEVICES=GPU-1"}, Slice: "user-1001.slice",
	}}
	envs := RuntimeEnvironments(rt)
	got, ok := envs.Session("a")
	want := SessionEnv{User: "gantry-a", RealUser: true, UID: 1001, GID: 1002, Dir: "/home/gantry/a", Shell: "/bin/bash",
		Env: []string{"HOME=/home/gantry/a", "CUDA_VISIBLE_DEVICES=GPU-1"}, Slice: "user-1001.slice"}
	if !ok || got.User != want.User || got.RealUser != want.RealUser || got.UID != want.UID || got.GID != want.GID ||
		got.Dir != want.Dir || got.Shell != want.Shell || !slices.Equal(got.Env, want.Env) || got.Slice != want.Slice || got.Groups != nil {
		t.Fatalf("Session(a) = %+v, %v\nwant %+v", got, ok, want)
	}
	if _, ok := envs.Session("b"); ok {
		t.Fatal("an allocation the runtime does not know is live")
	}
}
