package agent_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gantry-gpu/gantry/nodeagent/agent"
	"github.com/gantry-gpu/gantry/nodeagent/storagemount"
	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
	"github.com/gantry-gpu/gantry/shared/fabricnet"
)

// peerStorage answers Stat for one object, counting calls per attachment.
type peerStorage struct {
	fabricv1.UnimplementedStorageFabricServer
	mu    sync.Mutex
	stats int
}

func (s *peerStorage) Stat(ctx context.Context, r *fabricv1.StorageStatRequest) (*fabricv1.StorageObjectInfo, error) {
	s.mu.Lock()
	s.stats++
	s.mu.Unlock()
	if r.GetPath() != "a.txt" {
		return nil, status.Error(codes.NotFound, "no such object")
	}
	return &fabricv1.StorageObjectInfo{Path: "a.txt", Size: 3, Etag: `"x"`}, nil
}

// TestStorageCallsUseTheCurrentTunnel: StorageFabric calls go over the agent's tunnel
// (Options.OnConnection); a call made right after the tunnel was cut waits for, or is
// retried on, the next tunnel; once the agent has stopped a call fails cleanly with
// UNAVAILABLE instead of hanging.
func TestStorageCallsUseTheCurrentTunnel(t *testing.T) {
	p := newPeer(t, nil)
	conns := storagemount.NewConns()
	r := startAgent(t, p, fabricnet.ModeTCP, func(o *agent.Options) { o.OnConnection = conns.Set })
	p.waitFor("tunnel", func() bool { return r.a.Status().Connected })
	c := storagemount.NewClient(conns)
	c.Backoff = 20 * time.Millisecond
	ctx := context.Background()
	const att = "0190f6a0-0000-7000-8000-00000000b001"
	if info, err := c.Stat(ctx, att, "a.txt"); err != nil || info.GetSize() != 3 {
		t.Fatalf("stat: %v %v", info, err)
	}
	p.cut()
	if info, err := c.Stat(ctx, att, "a.txt"); err != nil || info.GetSize() != 3 {
		t.Fatalf("stat after cut: %v %v", info, err)
	}
	p.waitFor("second tunnel", func() bool { return r.a.Status().Sessions == 2 })
	if _, err := c.Stat(ctx, att, "missing.txt"); status.Code(err) != codes.NotFound {
		t.Fatalf("missing: %v", err)
	}
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	c.RetryFor = 200 * time.Millisecond
	if _, err := c.Stat(ctx, att, "a.txt"); status.Code(err) != codes.Unavailable {
		t.Fatalf("stat with the agent stopped: %v", err)
	}
}
