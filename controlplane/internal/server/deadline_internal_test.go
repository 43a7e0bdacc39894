package server

import (
	"context"
	"sort"
	"testing"
	"time"

	"github.com/gantry-gpu/gantry/controlplane/internal/contract"
)

// Every operation gets the request deadline except the WebSocket ones (those the
// contract answers 101), whose request lives as long as the session, and the object
// upload and download and the node agent package download (a machine being deployed
// fetches it), whose bytes take as long as the client's connection needs.
func TestDeadlinesSpareOnlyStreams(t *testing.T) {
	c := contract.MustLoad()
	d := newDeadlines(c, 3*time.Second)
	var streaming []string
	for _, op := range c.Ops() {
		ctx, cancel := d.apply(context.Background(), op)
		_, has := ctx.Deadline()
		cancel()
		if !has {
			streaming = append(streaming, op.Method+" "+op.Path)
		}
	}
	sort.Strings(streaming)
	want := []string{"GET /api/v1/app-artifacts/{artifact_id}/files", "GET /api/v1/internal/terminal/relay/{allocation_id}", "GET /api/v1/node-agent/package",
		"GET /api/v1/storage/buckets/{bucket_id}/object", "GET /ws/notifications", "GET /ws/ssh/{allocation_id}", "GET /ws/terminal/{allocation_id}",
		"PUT /api/v1/app-artifacts/{artifact_id}/files", "PUT /api/v1/storage/buckets/{bucket_id}/object"}
	if len(streaming) != len(want) {
		t.Fatalf("operations without a deadline: %v, want %v", streaming, want)
	}
	for i := range want {
		if streaming[i] != want[i] {
			t.Fatalf("operations without a deadline: %v, want %v", streaming, want)
		}
	}
	if off := newDeadlines(c, -1); len(c.Ops()) > 0 {
		ctx, cancel := off.apply(context.Background(), c.Ops()[0])
		defer cancel()
		if _, has := ctx.Deadline(); has {
			t.Fatal("a negative timeout still set a deadline")
		}
	}
	if newDeadlines(c, 0).timeout != DefaultRequestTimeout {
		t.Fatal("zero is not the default")
	}
}
