package outbox_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/gantry-gpu/gantry/controlplane/internal/apitest"
	"github.com/gantry-gpu/gantry/controlplane/internal/outbox"
	"github.com/gantry-gpu/gantry/shared/testenv"
)

// TestMain fails the package when a test leaves a goroutine behind (a relay or
// subscription not stopped).
func TestMain(m *testing.M) { testenv.MainThen(m, func() error { return goleak.Find() }) }

func TestRelayPublishesWithIDsAndHeaders(t *testing.T) {
	e := apitest.New(t)
	ctx := context.Background()
	_, adminTok := e.PlatformAdmin(t)
	ten := e.NewTenant(t, adminTok, "Events")

	req := e.Request("POST", "/api/v1/projects", ten.AdminToken, `{"name":"evented"}`)
	req.Header.Set("X-Request-Id", "corr-outbox-1")
	req.Header.Set("traceparent", "00-11111111111111111111111111111111-2222222222222222-01")
	if resp := e.Do(req); resp.StatusCode != 201 {
		t.Fatalf("create: %d", resp.StatusCode)
	}
	var eventID string
	if err := e.Pool.QueryRow(ctx, `SELECT id::text FROM outbox_events WHERE event_type = 'project.created' AND headers->>'x-correlation-id' = 'corr-outbox-1'`).Scan(&eventID); err != nil {
		t.Fatalf("outbox row: %v", err)
	}

	n, err := e.App.Relay.Drain(ctx)
	if err != nil || n < 3 { // tenant.created, project.created (default), project.created
		t.Fatalf("drained %d: %v", n, err)
	}
	var pending int
	if err := e.Pool.QueryRow(ctx, `SELECT count(*) FROM outbox_events WHERE published_at IS NULL`).Scan(&pending); err != nil || pending != 0 {
		t.Fatalf("pending %d %v", pending, err)
	}

	stream, err := e.App.JS.Stream(ctx, e.App.Config.EventsStream)
	if err != nil {
		t.Fatal(err)
	}
	info, _ := stream.Info(ctx)
	before := info.State.Msgs
	var found *jetstream.RawStreamMsg
	for seq := uint64(1); seq <= before; seq++ {
		m, err := stream.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		if m.Header.Get(nats.MsgIdHdr) == eventID {
			found = m
		}
	}
	if found == nil {
		t.Fatalf("event %s not in stream (%d msgs)", eventID, before)
	}
	if found.Header.Get("x-correlation-id") != "corr-outbox-1" || found.Header.Get("traceparent") == "" ||
		found.Header.Get("Gantry-Event-Type") != "project.created" || found.Subject != e.App.Config.EventsSubjectPrefix+"project.created" {
		t.Fatalf("headers %v subject %s", found.Header, found.Subject)
	}
	var payload map[string]any
	if err := json.Unmarshal(found.Data, &payload); err != nil || payload["project_id"] == nil {
		t.Fatalf("payload %s (%v)", found.Data, err)
	}

	// A re-publish of the same event (a relay that crashed before marking it) is a no-op.
	if _, err := e.App.Pool.Exec(ctx, `UPDATE outbox_events SET published_at = NULL WHERE id = $1`, eventID); err != nil {
		t.Fatal(err)
	}
	if _, err := e.App.Relay.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	info, _ = stream.Info(ctx)
	if info.State.Msgs != before {
		t.Fatalf("duplicate stored: %d -> %d", before, info.State.Msgs)
	}
}

func TestRelayWakesOnNotify(t *testing.T) {
	e := apitest.New(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	e.App.Relay.Idle = time.Hour // only a NOTIFY can wake it
	go func() { defer close(done); _ = e.App.Relay.Run(ctx) }()
	defer func() { cancel(); <-done }()

	_, adminTok := e.PlatformAdmin(t)
	e.NewTenant(t, adminTok, "Notified")
	deadline := time.Now().Add(10 * time.Second)
	for {
		var pending, total int
		if err := e.Pool.QueryRow(context.Background(), `SELECT count(*) FILTER (WHERE published_at IS NULL), count(*) FROM outbox_events`).Scan(&pending, &total); err != nil {
			t.Fatal(err)
		}
		if total > 0 && pending == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("relay did not publish on NOTIFY: %d of %d pending", pending, total)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestPruneRemovesOnlyLongPublishedEvents(t *testing.T) {
	e := apitest.New(t)
	ctx := context.Background()
	_, adminTok := e.PlatformAdmin(t)
	e.NewTenant(t, adminTok, "Pruned") // tenant.created + project.created
	if _, err := e.App.Relay.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	// One event published long ago, one still pending.
	if _, err := e.Pool.Exec(ctx, `UPDATE outbox_events SET published_at = now() - interval '8 days'
		WHERE id = (SELECT id FROM outbox_events ORDER BY id LIMIT 1)`); err != nil {
		t.Fatal(err)
	}
	e.NewTenant(t, adminTok, "Pending")
	var total, pending int
	count := func() {
		if err := e.Pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE published_at IS NULL) FROM outbox_events`).Scan(&total, &pending); err != nil {
			t.Fatal(err)
		}
	}
	count()
	before, pendingBefore := total, pending
	n, err := e.App.Relay.Prune(ctx)
	if err != nil || n != 1 {
		t.Fatalf("pruned %d: %v", n, err)
	}
	count()
	if total != before-1 || pending != pendingBefore || pending == 0 {
		t.Fatalf("total %d->%d, pending %d->%d", before, total, pendingBefore, pending)
	}
}

// A batch is sent whole before its acknowledgements are awaited; the first event the
// stream refuses stops the batch there: the events before it are published and marked,
// it is marked failed with the cause, and the events behind it stay pending (sent again
// with the next drain) even if the stream took them.
func TestRelayStopsAtFirstFailure(t *testing.T) {
	e := apitest.New(t)
	ctx := context.Background()
	if _, err := e.App.Relay.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	// Stored subjects under gantry.nostream. go to subjects no stream holds.
	e.App.Relay.Routes = append(e.App.Relay.Routes, outbox.Route{From: "gantry.nostream.", To: "gantry-test-nostream-" + uuid.NewString()[:8] + "."})
	ids := []uuid.UUID{uuid.New(), uuid.New(), uuid.New()}
	subjects := []string{"gantry.events.test.first", "gantry.nostream.second", "gantry.events.test.third"}
	base := time.Now().Add(-time.Minute)
	for i, id := range ids {
		if _, err := e.Pool.Exec(ctx, `INSERT INTO outbox_events (id, event_type, subject, payload, headers, created_at) VALUES ($1, $2, $3, '{}', '{}', $4)`,
			id, "test.event", subjects[i], base.Add(time.Duration(i)*time.Millisecond)); err != nil {
			t.Fatal(err)
		}
	}
	n, err := e.App.Relay.Drain(ctx)
	if err == nil || n != 1 {
		t.Fatalf("drain: published %d, err %v; want 1 and the second event's error", n, err)
	}
	for i, id := range ids {
		var published bool
		var attempts int
		var lastError *string
		if err := e.Pool.QueryRow(ctx, `SELECT published_at IS NOT NULL, attempts, last_error FROM outbox_events WHERE id = $1`, id).Scan(&published, &attempts, &lastError); err != nil {
			t.Fatal(err)
		}
		switch i {
		case 0:
			if !published || attempts != 1 || lastError != nil {
				t.Fatalf("first event: published %v attempts %d error %v", published, attempts, lastError)
			}
		case 1:
			if published || attempts != 1 || lastError == nil || *lastError == "" {
				t.Fatalf("refused event: published %v attempts %d error %v", published, attempts, lastError)
			}
		case 2:
			if published || attempts != 0 || lastError != nil {
				t.Fatalf("event behind the refused one: published %v attempts %d error %v", published, attempts, lastError)
			}
		}
	}
}
