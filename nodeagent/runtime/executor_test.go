package runtime

import (
	"context"
	"encoding/json"
	"slices"
	"testing"

	"github.com/gantry-gpu/gantry/nodeagent/tasks"
	"github.com/gantry-gpu/gantry/shared/alloctask"
)

// TestExecutorRoutesAllocationKinds drives the runtime through the tasks.Mux the agent
// uses: the four kinds are advertised, provision and restart return the JSON
// ProvisionResult, stop and release return nothing, and bad tasks get invalid_payload.
func TestExecutorRoutesAllocationKinds(t *testing.T) {
	gpus := mockGPUs(t)
	inv := inventory(t, gpus)
	r := newProcessRuntime(t, t.TempDir(), gpus)
	mux := r.Mux()
	want := slices.Sorted(slices.Values(alloctask.Kinds))
	if got := mux.Kinds(); !slices.Equal(got, want) {
		t.Fatalf("kinds %v, want %v", got, want)
	}
	p := payload(t, inv, 6, 7)
	body, _ := json.Marshal(p)
	run := func(kind string, payload []byte, contentType string) tasks.Result {
		return mux.Execute(context.Background(), tasks.Task{ID: "t-" + kind, Kind: kind, Payload: payload, ContentType: contentType, Attempt: 1})
	}
	for _, kind := range []string{alloctask.KindProvision, alloctask.KindRestart} {
		res := run(kind, body, alloctask.ContentType)
		var out alloctask.ProvisionResult
		if res.Status != tasks.Succeeded || json.Unmarshal(res.Output, &out) != nil {
			t.Fatalf("%s: %+v", kind, res)
		}
		if out != (alloctask.ProvisionResult{Host: "gpu-01.example", Port: 2222, User: p.User}) {
			t.Fatalf("%s output %s", kind, res.Output)
		}
	}
	for _, kind := range []string{alloctask.KindStop, alloctask.KindRelease} {
		if res := run(kind, body, ""); res.Status != tasks.Succeeded || res.Output != nil {
			t.Fatalf("%s: %+v", kind, res)
		}
	}
	if r.Phase(p.AllocationID) != PhaseReleased {
		t.Fatalf("phase %q", r.Phase(p.AllocationID))
	}

	bad := payload(t, inv, 0)
	badBody, _ := json.Marshal(bad)
	gone := payload(t, inv, 0)
	gone.GPUs[0].UUID = "GPU-ffffffff-ffff-ffff-ffff-ffffffffffff"
	goneBody, _ := json.Marshal(gone)
	for name, c := range map[string]struct {
		kind, contentType string
		payload           []byte
		code              string
	}{
		"not json":             {alloctask.KindProvision, "", []byte("{"), alloctask.CodeInvalidPayload},
		"protobuf":             {alloctask.KindProvision, "application/protobuf", badBody, alloctask.CodeInvalidPayload},
		"too large":            {alloctask.KindProvision, "", make([]byte, maxPayloadBytes+1), alloctask.CodeInvalidPayload},
		"empty payload":        {alloctask.KindRelease, "", nil, alloctask.CodeInvalidPayload},
		"gpu not on this host": {alloctask.KindProvision, "", goneBody, alloctask.CodeGPUUnavailable},
		"released":             {alloctask.KindRestart, "", body, alloctask.CodeNotFound},
		"unknown kind":         {"allocation.resize", "", badBody, tasks.CodeUnsupportedKind},
	} {
		res := run(c.kind, c.payload, c.contentType)
		if res.Status != tasks.Failed || res.ErrorCode != c.code || res.ErrorMessage == "" {
			t.Errorf("%s: %+v, want %s", name, res, c.code)
		}
	}
	if r.Phase(bad.AllocationID) != PhaseNone {
		t.Fatal("a rejected task left a record")
	}
}

// TestExecutorCancelledIsNotRemembered: a task whose context has ended (agent shutdown)
// does nothing and fails with tasks.CodeCancelled, which tasks.Once does not remember,
// so the redelivery after the restart runs it.
func TestExecutorCancelledIsNotRemembered(t *testing.T) {
	gpus := mockGPUs(t)
	r := newProcessRuntime(t, t.TempDir(), gpus)
	p := payload(t, inventory(t, gpus), 0)
	body, _ := json.Marshal(p)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	once := tasks.NewOnce(r.Mux(), 0)
	task := tasks.Task{ID: "t1", Kind: alloctask.KindProvision, Payload: body}
	if res := once.Execute(ctx, task); res.Status != tasks.Failed || res.ErrorCode != tasks.CodeCancelled {
		t.Fatalf("cancelled run: %+v", res)
	}
	if state, _ := once.Lookup("t1"); state != tasks.Unknown {
		t.Fatalf("cancelled result remembered: %v", state)
	}
	if r.Phase(p.AllocationID) != PhaseNone {
		t.Fatalf("a cancelled task left phase %q", r.Phase(p.AllocationID))
	}
	if res := once.Execute(context.Background(), task); res.Status != tasks.Succeeded {
		t.Fatalf("redelivery: %+v", res)
	}
}
