package e2e_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"golang.org/x/crypto/ssh"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gantry-gpu/gantry/controlplane/internal/apitest"
	"github.com/gantry-gpu/gantry/controlplane/internal/fabric/fabrictest"
	"github.com/gantry-gpu/gantry/controlplane/internal/storage/attach"
	"github.com/gantry-gpu/gantry/nodeagent/agent"
	"github.com/gantry-gpu/gantry/nodeagent/terminal"
	"github.com/gantry-gpu/gantry/proto/api"
	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
	"github.com/gantry-gpu/gantry/shared/fabricnet"
)

// storageWorld is a control plane with a node agent on the process runtime, a tenant
// with an active allocation on it, and a bucket of that tenant's default project.
type storageWorld struct {
	c        *cp
	nodeID   uuid.UUID
	tenant   apitest.Tenant
	alice    *api.ClientWithResponses
	token    string
	project  uuid.UUID
	alloc    uuid.UUID
	stateDir string
	// shellLimit bounds one shell command (default 60 s; the benchmark reads 1 GiB).
	shellLimit time.Duration
}

// newStorageWorld starts it all; mode is the agent's storage_mode ("fuse" or "copy"),
// transport its fabric transport ("" for the default, auto).
func newStorageWorld(t testing.TB, mode, transport string) *storageWorld {
	c := startCP(t)
	c.runBackground(c.app)
	// Attachment delivery's sweep (the request sends each task itself; the sweep
	// redelivers and catches up).
	sweepCtx, stopSweep := context.WithCancel(context.Background())
	sweepDone := make(chan struct{})
	go func() { defer close(sweepDone); c.app.Attachments.Run(sweepCtx) }()
	t.Cleanup(func() { stopSweep(); <-sweepDone; c.app.Attachments.Wait() })
	c.catalogForAllocations()
	ctx := context.Background()

	host := "gpu-storage-" + mode
	nodeID, tok := c.newNode(host)
	region := e2eRegion
	if r, err := c.client().UpdateNodeWithResponse(ctx, nodeID, &api.UpdateNodeParams{}, api.UpdateNodeJSONRequestBody{Region: &region}); err != nil || r.StatusCode() != 200 {
		t.Fatalf("node region: %v %s", err, r.Body)
	}
	e := c.enrollAgent(tok, host)
	e.cfg.Runtime = "process"
	e.cfg.StateDir = filepath.Join(filepath.Dir(e.cfg.Path), "state")
	e.cfg.AdvertiseHost = host + ".example"
	e.cfg.StorageMode = mode
	if transport != "" {
		e.cfg.Transport = transport
	}
	// `gantry-nodeagent run` in-process: the runtime, the terminal server and the
	// storage attachments (nodeagent/storagemount) as the binary wires them.
	agentCtx, stopAgent := context.WithCancel(context.Background())
	agentDone := make(chan error, 1)
	log := slog.New(slog.NewTextHandler(testLog{t}, &slog.HandlerOptions{Level: slog.LevelInfo})).With("agent", host)
	go func() { agentDone <- agent.RunConfig(agentCtx, e.cfg, "e2e-1.0", log) }()
	t.Cleanup(func() {
		stopAgent()
		select {
		case <-agentDone:
		case <-time.After(30 * time.Second):
			t.Error("agent did not stop within 30s of cancellation")
		}
	})
	eventually(t, "agent online", func() bool {
		n, ok := c.fleetNode(nodeID)
		return ok && n.Status == api.NodeStatusOnline
	})

	tenant := c.env.NewTenant(t, c.admin, "Storage "+mode)
	alice := c.env.Client(tenant.AdminToken)
	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	sp, _ := ssh.NewPublicKey(pub)
	if r, err := alice.CreateSSHKeyWithResponse(ctx, &api.CreateSSHKeyParams{}, api.CreateSSHKeyJSONRequestBody{Name: "laptop", PublicKey: strings.TrimSpace(string(ssh.MarshalAuthorizedKey(sp)))}); err != nil || r.StatusCode() != 201 {
		t.Fatalf("ssh key: %v %s", err, r.Body)
	}
	if r, err := c.client().CreateBillingAdjustmentWithResponse(ctx, &api.CreateBillingAdjustmentParams{},
		api.BillingAdjustmentRequest{TenantID: tenant.ID, Amount: api.Money{AmountMinor: 1_000_000, Currency: "USD"}, Reason: "e2e credit"}); err != nil || r.StatusCode() != 201 {
		t.Fatalf("credit: %v %s", err, r.Body)
	}
	key := uuid.NewString()
	cr, err := alice.CreateAllocationWithResponse(ctx, &api.CreateAllocationParams{XProjectID: tenant.DefaultProject, IdempotencyKey: &key},
		api.CreateAllocationJSONRequestBody{Name: "train", Sku: e2eSKU})
	if err != nil || cr.StatusCode() != 201 {
		t.Fatalf("create allocation: %v %s", err, cr.Body)
	}
	w := &storageWorld{c: c, nodeID: nodeID, tenant: tenant, alice: alice, token: tenant.AdminToken,
		project: tenant.DefaultProject, alloc: cr.JSON201.ID, stateDir: e.cfg.StateDir}
	eventually(t, "allocation active", func() bool { return w.allocationStatus(t) == "active" })

	if r, err := alice.CreateStorageBucketWithResponse(ctx, &api.CreateStorageBucketParams{XProjectID: w.project},
		api.CreateStorageBucketJSONRequestBody{BucketID: "data"}); err != nil || r.StatusCode() != 201 {
		t.Fatalf("create bucket: %v %s", err, r.Body)
	}
	return w
}

func (w *storageWorld) allocationStatus(t testing.TB) string {
	r, err := w.alice.GetAllocationWithResponse(context.Background(), w.alloc, &api.GetAllocationParams{XProjectID: w.project})
	if err != nil || r.JSON200 == nil {
		t.Fatalf("get allocation: %v %s", err, r.Body)
	}
	return string(r.JSON200.Status)
}

// object does one object request through the HTTP API.
func (w *storageWorld) object(t testing.TB, method, path string, body string) (int, string) {
	t.Helper()
	var rd io.Reader
	if method == http.MethodPut {
		rd = strings.NewReader(body)
	}
	req, _ := http.NewRequest(method, w.c.url+"/api/v1/storage/buckets/data/object?path="+url.QueryEscape(path), rd)
	req.Header.Set("Authorization", "Bearer "+w.token)
	req.Header.Set("X-Project-ID", w.project.String())
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

func (w *storageWorld) usedBytes(t testing.TB) int64 {
	t.Helper()
	r, err := w.alice.GetStorageQuotaWithResponse(context.Background(), &api.GetStorageQuotaParams{XProjectID: w.project})
	if err != nil || r.JSON200 == nil {
		t.Fatalf("quota: %v %s", err, r.Body)
	}
	return r.JSON200.UsedBytes
}

func (w *storageWorld) attach(t testing.TB, mode, mountPath string) api.StorageAttachment {
	t.Helper()
	body := api.CreateStorageAttachmentJSONRequestBody{BucketID: "data", Mode: api.StorageAttachmentMode(mode)}
	if mountPath != "" {
		body.MountPath = &mountPath
	}
	r, err := w.alice.CreateStorageAttachmentWithResponse(context.Background(), w.alloc, &api.CreateStorageAttachmentParams{XProjectID: w.project}, body)
	if err != nil || r.JSON202 == nil {
		t.Fatalf("attach %s: %v %d %s", mode, err, r.StatusCode(), r.Body)
	}
	if r.JSON202.State != "attaching" {
		t.Fatalf("attach answered %s, want attaching", r.JSON202.State)
	}
	return *r.JSON202
}

func (w *storageWorld) attachments(t testing.TB) map[uuid.UUID]api.StorageAttachment {
	t.Helper()
	r, err := w.alice.ListStorageAttachmentsWithResponse(context.Background(), w.alloc, &api.ListStorageAttachmentsParams{XProjectID: w.project})
	if err != nil || r.JSON200 == nil {
		t.Fatalf("list attachments: %v %s", err, r.Body)
	}
	out := map[uuid.UUID]api.StorageAttachment{}
	for _, a := range r.JSON200.Items {
		out[a.AttachmentID] = a
	}
	return out
}

func (w *storageWorld) waitState(t testing.TB, id uuid.UUID, state string) api.StorageAttachment {
	t.Helper()
	var last api.StorageAttachment
	eventually(t, "attachment "+state, func() bool {
		last = w.attachments(t)[id]
		if last.State == "failed" && state != "failed" {
			t.Fatalf("attachment failed: %v", ptrText(last.Error))
		}
		return string(last.State) == state
	})
	return last
}

func (w *storageWorld) detach(t testing.TB, id uuid.UUID) {
	t.Helper()
	r, err := w.alice.DeleteStorageAttachmentWithResponse(context.Background(), w.alloc, id, &api.DeleteStorageAttachmentParams{XProjectID: w.project})
	if err != nil || r.JSON202 == nil {
		t.Fatalf("detach: %v %d %s", err, r.StatusCode(), r.Body)
	}
}

// shell runs script with /bin/sh inside the allocation, as the user's terminal does: a
// terminal stream over the fabric to the node's agent, which starts it in the
// allocation's runtime (its user, home and environment). It returns the output (CR LF
// as LF) and the exit code.
func (w *storageWorld) shell(t testing.TB, script string) (string, int) {
	t.Helper()
	limit := w.shellLimit
	if limit == 0 {
		limit = 60 * time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	st, err := w.c.app.Fabric.OpenStream(ctx, w.nodeID, &fabricv1.StreamPreamble{
		Kind: fabricv1.StreamKind_STREAM_KIND_TERMINAL, StreamId: uuid.NewString(), AllocationId: w.alloc.String(),
		TerminalSize: &fabricv1.TerminalSize{Cols: 200, Rows: 50}, Command: []string{"/bin/sh", "-c", script},
	})
	if err != nil {
		t.Fatalf("terminal stream: %v", err)
	}
	defer st.Close()
	_ = st.SetDeadline(time.Now().Add(limit))
	fc := terminal.NewFrameConn(st)
	out, err := io.ReadAll(fc)
	if err != nil {
		t.Fatalf("shell %q: %v (output %q)", script, err, out)
	}
	if fc.Exit == nil || fc.Exit.Code == nil {
		t.Fatalf("shell %q: no exit status (output %q)", script, out)
	}
	return strings.ReplaceAll(string(out), "\r\n", "\n"), *fc.Exit.Code
}

func (w *storageWorld) post(t testing.TB, token string, project uuid.UUID, body map[string]any) apitest.Answer {
	t.Helper()
	return w.c.env.Call(t, http.MethodPost, "/api/v1/allocations/"+w.alloc.String()+"/storage-attachments", token, body, project.String())
}

// refusals is the bad input of an attachment: each a clear error, nothing persisted.
func (w *storageWorld) refusals(t testing.TB) {
	t.Helper()
	cases := []struct {
		name   string
		body   map[string]any
		status int
		code   string
	}{
		{"traversal", map[string]any{"bucket_id": "data", "mode": "ro", "mount_path": "../../etc"}, 400, "storage_path_traversal"},
		{"encoded traversal", map[string]any{"bucket_id": "data", "mode": "ro", "mount_path": "a/%2e%2e/%2e%2e/b"}, 400, "storage_path_traversal"},
		{"absolute", map[string]any{"bucket_id": "data", "mode": "ro", "mount_path": "/etc/x"}, 400, "storage_path_traversal"},
		{"not canonical", map[string]any{"bucket_id": "data", "mode": "ro", "mount_path": "a//b"}, 422, "validation_error"},
		{"unknown bucket", map[string]any{"bucket_id": "nope", "mode": "ro"}, 404, "storage_object_not_found"},
		{"bad mode", map[string]any{"bucket_id": "data", "mode": "rwx"}, 422, "validation_error"},
	}
	for _, c := range cases {
		if r := w.post(t, w.token, w.project, c.body); r.Status != c.status || r.Code() != c.code {
			t.Errorf("%s: %d %s, want %d %s", c.name, r.Status, r.Raw, c.status, c.code)
		}
	}
	// Another tenant cannot see the allocation (nor attach its own bucket to it).
	other := w.c.env.NewTenant(t, w.c.admin, "Other")
	if r := w.post(t, other.AdminToken, other.DefaultProject, map[string]any{"bucket_id": "data", "mode": "ro"}); r.Status != 404 || r.Code() != "allocation_not_found" {
		t.Errorf("other tenant: %d %s", r.Status, r.Raw)
	}
	if n := w.c.env.Count(t, `SELECT count(*) FROM storage_attachments WHERE allocation_id = $1`, w.alloc); n != 0 {
		t.Fatalf("%d attachments persisted by refused requests", n)
	}
}

// fabricRefusals: another node's tunnel asks StorageFabric for this allocation's
// attachment and gets PERMISSION_DENIED, the same answer as for an attachment that does
// not exist (no existence leak).
func (w *storageWorld) fabricRefusals(t testing.TB, attachmentID uuid.UUID) {
	t.Helper()
	_, tok := w.c.newNode("gpu-storage-other")
	e := w.c.enrollAgent(tok, "gpu-storage-other")
	token, err := e.cfg.ReadToken()
	if err != nil {
		t.Fatal(err)
	}
	other := fabrictest.NewAgent(w.c.app.Fabric.Addr(), token, w.c.app.Fabric.CAPEM(), fabricnet.ModeTCP)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = other.Run(ctx) }()
	defer func() { cancel(); <-done }()
	var conn fabrictest.Connection
	select {
	case conn = <-other.Sessions:
	case <-time.After(60 * time.Second):
		t.Fatal("the other node's tunnel did not come up")
	}
	cc, err := fabricnet.GRPCClient(conn.Session)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	sf := fabricv1.NewStorageFabricClient(cc)
	// The server itself, as the attachment's own node calls it: reads are served, a
	// delete through the ro attachment is refused (the agent's FUSE refuses writes
	// before they leave the node; the control plane refuses them anyway).
	own := &attach.FabricServer{Svc: w.c.app.Attachments, Objects: attach.StoreObjects{Store: w.c.app.Objects},
		NodeOf: func(context.Context) (uuid.UUID, bool) { return w.nodeID, true }}
	if info, err := own.Stat(ctx, &fabricv1.StorageStatRequest{AttachmentId: attachmentID.String(), Path: "hello.txt"}); err != nil || info.GetSize() == 0 {
		t.Fatalf("the attachment's node Stat: %v %v", info, err)
	}
	if _, err := own.Delete(ctx, &fabricv1.StorageDeleteRequest{AttachmentId: attachmentID.String(), Path: "hello.txt"}); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("delete through the ro attachment: %v, want PermissionDenied", err)
	}
	if _, err := own.Stat(ctx, &fabricv1.StorageStatRequest{AttachmentId: attachmentID.String(), Path: "../escape"}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("a traversal path over the fabric: %v, want InvalidArgument", err)
	}
	w.rawReadsOnOneStream(t, own, attachmentID)
	for _, id := range []string{attachmentID.String(), uuid.NewString(), "not-a-uuid"} {
		_, err := sf.Stat(ctx, &fabricv1.StorageStatRequest{AttachmentId: id, Path: "hello.txt"})
		if status.Code(err) != codes.PermissionDenied {
			t.Fatalf("another node's Stat of attachment %s: %v, want PermissionDenied", id, err)
		}
		rd, err := sf.Read(ctx, &fabricv1.StorageReadRequest{AttachmentId: id, Path: "hello.txt"})
		if err == nil {
			_, err = rd.Recv()
		}
		if status.Code(err) != codes.PermissionDenied {
			t.Fatalf("another node's Read of attachment %s: %v, want PermissionDenied", id, err)
		}
		// The raw read stream (the agent's bulk path) runs the same checks.
		st, err := fabricnet.OpenAgentStream(ctx, conn.Session, fabricnet.AgentStreamStorageRead, &fabricv1.StorageReadRequest{AttachmentId: id, Path: "hello.txt"})
		var ref *fabricnet.StreamRefusedError
		if !errors.As(err, &ref) || ref.Code != codes.PermissionDenied.String() {
			if st != nil {
				st.Close()
			}
			t.Fatalf("another node's raw read of attachment %s: %v, want PERMISSION_DENIED", id, err)
		}
	}
}

// rawReadsOnOneStream: the control plane's raw read stream serves one range after
// another, each checked on its own (a refused one leaves the stream usable), and owes
// exactly the range's bytes.
func (w *storageWorld) rawReadsOnOneStream(t testing.TB, own *attach.FabricServer, attachmentID uuid.UUID) {
	t.Helper()
	agentEnd, cpEnd := net.Pipe()
	defer agentEnd.Close()
	go func() {
		defer cpEnd.Close()
		// The fabric server has read the stream's kind before it calls the handler.
		own.ServeRawRead(context.Background(), cpEnd)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_ = agentEnd.SetDeadline(time.Now().Add(30 * time.Second))
	read := func(off, n int64) string {
		t.Helper()
		req := &fabricv1.StorageReadRequest{AttachmentId: attachmentID.String(), Path: "hello.txt", Offset: off, Length: n}
		if err := fabricnet.AgentStreamRequest(ctx, agentEnd, req); err != nil {
			t.Fatalf("raw read %d+%d: %v", off, n, err)
		}
		var info fabricv1.StorageObjectInfo
		if err := fabricnet.ReadFrame(agentEnd, &info); err != nil {
			t.Fatal(err)
		}
		want := min(n, info.GetSize()-off)
		buf := make([]byte, want)
		if _, err := io.ReadFull(agentEnd, buf); err != nil {
			t.Fatalf("raw read %d+%d: %v", off, n, err)
		}
		return string(buf)
	}
	whole := read(0, 1<<20)
	if len(whole) < 4 {
		t.Fatalf("raw read of hello.txt: %q, want at least 4 bytes", whole)
	}
	err := fabricnet.AgentStreamRequest(ctx, agentEnd, &fabricv1.StorageReadRequest{AttachmentId: attachmentID.String(), Path: "../escape"})
	var ref *fabricnet.StreamRefusedError
	if !errors.As(err, &ref) || ref.Code != codes.InvalidArgument.String() {
		t.Fatalf("raw read of a traversal path: %v, want INVALID_ARGUMENT", err)
	}
	if got := read(1, 3); got != whole[1:4] {
		t.Fatalf("second range on the stream: %q, want %q", got, whole[1:4])
	}
}

func ptrText(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func fuseUsable() (bool, string) {
	f, err := os.OpenFile("/dev/fuse", os.O_RDWR, 0)
	if err != nil {
		return false, fmt.Sprintf("/dev/fuse is not usable here: %v", err)
	}
	_ = f.Close()
	return true, ""
}

// TestStorageAttachmentInsideAllocation is issue 20's attachment test: a real allocation
// on the dev node agent (process runtime), with a bucket attached read-only and then
// read-write, read and written from a shell inside the allocation (a terminal stream
// through the fabric), never by calling the storage service directly. ro: the shell sees
// the file and the folder, and a write is refused (FUSE) or never reaches the bucket
// (copy); detach removes it. rw: a file written in the shell lands in the bucket,
// visible through the API with its content, and the project's quota usage grows by its
// size; release of the allocation detaches everything. Both methods: FUSE (where
// /dev/fuse works) and copy mode (forced by the agent's storage_mode).
func TestStorageAttachmentInsideAllocation(t *testing.T) {
	for _, mode := range []string{"fuse", "copy"} {
		t.Run(mode, func(t *testing.T) {
			if mode == "fuse" {
				if ok, why := fuseUsable(); !ok {
					t.Skip(why)
				}
			}
			w := newStorageWorld(t, mode, "")
			const hello = "hello from the bucket"
			if code, body := w.object(t, http.MethodPut, "hello.txt", hello+"\n"); code != 201 && code != 200 {
				t.Fatalf("put hello.txt: %d %s", code, body)
			}
			if code, body := w.object(t, http.MethodPut, "dir/nested.txt", "nested\n"); code != 201 && code != 200 {
				t.Fatalf("put dir/nested.txt: %d %s", code, body)
			}

			w.refusals(t)

			// Read-only, at the default path ~/buckets/data.
			ro := w.attach(t, "ro", "")
			got := w.waitState(t, ro.AttachmentID, "attached")
			// The mount path is taken while the attachment lives.
			if r := w.post(t, w.token, w.project, map[string]any{"bucket_id": "data", "mode": "ro"}); r.Status != 409 || r.Code() != "storage_already_exists" {
				t.Fatalf("second attachment at the same path: %d %s", r.Status, r.Raw)
			}
			if got.Method == nil || string(*got.Method) != mode {
				t.Fatalf("attached by %v, want %s", got.Method, mode)
			}
			out, code := w.shell(t, `cat "$HOME/buckets/data/hello.txt" && ls "$HOME/buckets/data" && cat "$HOME/buckets/data/dir/nested.txt"`)
			if code != 0 || !strings.Contains(out, hello) || !strings.Contains(out, "dir") || !strings.Contains(out, "nested") {
				t.Fatalf("reading the ro attachment from the shell: exit %d, output %q", code, out)
			}
			w.fabricRefusals(t, ro.AttachmentID)
			out, code = w.shell(t, `echo sneaky > "$HOME/buckets/data/sneaky.txt"`)
			if mode == "fuse" && code == 0 {
				t.Fatalf("a write into the ro FUSE mount succeeded: %q", out)
			}
			w.detach(t, ro.AttachmentID)
			w.waitState(t, ro.AttachmentID, "detached")
			if status, _ := w.object(t, http.MethodGet, "sneaky.txt", ""); status != 404 {
				t.Fatalf("a write through the ro attachment reached the bucket (GET %d)", status)
			}
			out, _ = w.shell(t, `cat "$HOME/buckets/data/hello.txt" 2>&1; echo "exit=$?"`)
			if strings.Contains(out, hello) {
				t.Fatalf("the detached bucket is still readable in the allocation: %q", out)
			}

			// Read-write: a file written in the shell lands in the bucket.
			before := w.usedBytes(t)
			rw := w.attach(t, "rw", "work/data")
			w.waitState(t, rw.AttachmentID, "attached")
			const result = "written inside the allocation"
			out, code = w.shell(t, `mkdir -p "$HOME/work/data/out" && printf '`+result+`\n' > "$HOME/work/data/out/result.txt" && cat "$HOME/work/data/out/result.txt"`)
			if code != 0 || !strings.Contains(out, result) {
				t.Fatalf("writing into the rw attachment: exit %d, output %q", code, out)
			}
			w.detach(t, rw.AttachmentID) // copy mode uploads its changes now
			w.waitState(t, rw.AttachmentID, "detached")
			status, body := w.object(t, http.MethodGet, "out/result.txt", "")
			if status != 200 || body != result+"\n" {
				t.Fatalf("the file written in the allocation through the API: %d %q", status, body)
			}
			if after := w.usedBytes(t); after != before+int64(len(result)+1) {
				t.Fatalf("quota used bytes %d -> %d, want +%d", before, after, len(result)+1)
			}

			// Release detaches everything, and a rw attachment's last writes land.
			rw2 := w.attach(t, "rw", "")
			ro2 := w.attach(t, "ro", "ro-view")
			w.waitState(t, rw2.AttachmentID, "attached")
			w.waitState(t, ro2.AttachmentID, "attached")
			if out, code := w.shell(t, `printf 'at release\n' > "$HOME/buckets/data/last.txt"`); code != 0 {
				t.Fatalf("write before release: exit %d %q", code, out)
			}
			rr, err := w.alice.ReleaseAllocationWithResponse(context.Background(), w.alloc, &api.ReleaseAllocationParams{XProjectID: w.project})
			if err != nil || rr.StatusCode() != 200 {
				t.Fatalf("release: %v %s", err, rr.Body)
			}
			eventually(t, "allocation released", func() bool { return w.allocationStatus(t) == "released" })
			for id, a := range w.attachments(t) {
				if a.State != "detached" {
					t.Fatalf("after release attachment %s is %s", id, a.State)
				}
			}
			if status, body := w.object(t, http.MethodGet, "last.txt", ""); status != 200 || body != "at release\n" {
				t.Fatalf("the write made just before release: %d %q", status, body)
			}
		})
	}
}
