package proxy_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/apps/proxy"
	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
	"github.com/gantry-gpu/gantry/shared/testenv/ci"
)

// launch starts an app process through the node's real app supervisor (what an
// app.start task does), waits for its health check to pass, and records the instance
// as the instances service would once the agent reported it running.
func (w *world) launch(t testing.TB, node *gpuNode, command []string, health *fabricv1.AppHealthCheck) uuid.UUID {
	t.Helper()
	id, _ := w.launchEnv(t, node, command, nil, health)
	return id
}

// launchEnv is launch with an environment for the app; it also returns the app's
// loopback address.
func (w *world) launchEnv(t testing.TB, node *gpuNode, command []string, env map[string]string, health *fabricv1.AppHealthCheck) (uuid.UUID, string) {
	t.Helper()
	id, alloc := uuid.New(), uuid.New()
	node.envs.add(alloc)
	spec := &fabricv1.AppStartTask{AppInstanceId: id.String(), AllocationId: alloc.String(), AppSlug: "test-app", Version: "1",
		Command: command, Env: env, BasePath: proxy.InstancePath(id), HealthCheck: health}
	port, code, err := node.sup.Start(spec)
	if err != nil {
		t.Fatalf("app start: %s %v", code, err)
	}
	eventually(t, "the app healthy", func() bool {
		for _, r := range node.sup.Reports() {
			if r.GetObjectId() == id.String() {
				if r.GetState() == "failed" {
					t.Fatalf("the app failed: %s %s", r.GetAppInstance().GetReason(), r.GetMessage())
				}
				return r.GetState() == "running"
			}
		}
		return false
	})
	runSpec, _ := json.Marshal(map[string]any{"command": command[0], "args": command[1:]})
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	return w.record(t, id, alloc, node, addr, "running", string(runSpec), false), addr
}

// TestJupyterThroughProxy runs a real Jupyter Notebook server (the Debian package
// python3-notebook, which .ci/run installs) under the node's app supervisor, opens it
// in a "browser" through the exchange, starts a kernel and executes a cell over the
// kernel's WebSocket, all through the proxy and the node fabric.
func TestJupyterThroughProxy(t *testing.T) {
	if err := exec.Command("/usr/bin/python3", "-c", "import notebook, ipykernel").Run(); err != nil {
		ci.Missing(t, "Jupyter (apt-get install python3-notebook): "+err.Error())
	}
	w := newWorld(t)
	node := w.agentNode(t)
	id := w.launch(t, node, []string{"/usr/bin/python3", "-m", "notebook", "--no-browser", "--ip=127.0.0.1", "--port={port}",
		"--NotebookApp.token=", "--NotebookApp.password=", "--NotebookApp.base_url={base_path}",
		"--NotebookApp.disable_check_xsrf=True", "--NotebookApp.open_browser=False", "--allow-root"},
		&fabricv1.AppHealthCheck{Type: "tcp"})
	base := w.URL + proxy.InstancePath(id)

	// The browser's way in: the exchange sets the cookie, the notebook tree answers.
	s, err := w.mint(t, w.Acme.AdminToken, id)
	if err != nil {
		t.Fatal(err)
	}
	b := cookieClient(t)
	resp := do(t, b, http.MethodGet, w.URL+s.URL, "", nil)
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(page), "Jupyter") || !strings.HasPrefix(resp.Request.URL.Path, proxy.InstancePath(id)) {
		t.Fatalf("notebook page: %d at %s", resp.StatusCode, resp.Request.URL)
	}

	// A kernel, through the proxy with the cookie.
	resp = do(t, b, http.MethodPost, base+"api/kernels", "", strings.NewReader(`{"name":"python3"}`))
	var kernel struct {
		ID string `json:"id"`
	}
	kb, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err := json.Unmarshal(kb, &kernel); err != nil || resp.StatusCode != 201 || kernel.ID == "" {
		t.Fatalf("start kernel: %d %s", resp.StatusCode, kb)
	}

	// Its channels WebSocket, with the cookie the exchange set.
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	ws, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(base, "http")+"api/kernels/"+kernel.ID+"/channels?session_id="+uuid.NewString(),
		&websocket.DialOptions{HTTPClient: b})
	if err != nil {
		t.Fatal(err)
	}
	defer ws.CloseNow()
	ws.SetReadLimit(16 << 20)
	msgID, session := uuid.NewString(), uuid.NewString()
	req := map[string]any{
		"header": map[string]any{"msg_id": msgID, "username": "test", "session": session, "msg_type": "execute_request",
			"version": "5.3", "date": time.Now().UTC().Format(time.RFC3339)},
		"parent_header": map[string]any{}, "metadata": map[string]any{}, "channel": "shell", "buffers": []any{},
		"content": map[string]any{"code": "print(6 * 7)", "silent": false, "store_history": true,
			"user_expressions": map[string]any{}, "allow_stdin": false, "stop_on_error": true},
	}
	out, _ := json.Marshal(req)
	if err := ws.Write(ctx, websocket.MessageText, out); err != nil {
		t.Fatal(err)
	}
	var printed, replied bool
	for !printed || !replied {
		_, m, err := ws.Read(ctx)
		if err != nil {
			t.Fatalf("kernel channel: %v (printed %v, replied %v)", err, printed, replied)
		}
		var msg struct {
			Header struct {
				MsgType string `json:"msg_type"`
			} `json:"header"`
			ParentHeader struct {
				MsgID string `json:"msg_id"`
			} `json:"parent_header"`
			Content map[string]any `json:"content"`
		}
		if json.Unmarshal(m, &msg) != nil || msg.ParentHeader.MsgID != msgID {
			continue
		}
		switch msg.Header.MsgType {
		case "stream":
			if msg.Content["text"] == "42\n" {
				printed = true
			}
		case "execute_reply":
			if msg.Content["status"] != "ok" {
				t.Fatalf("execute_reply %v", msg.Content)
			}
			replied = true
		}
	}
	_ = ws.Close(websocket.StatusNormalClosure, "")
	// Without the cookie or a token, the notebook is not reachable.
	wantEnvelope(t, do(t, http.DefaultClient, http.MethodGet, base+"api/kernels", "", nil), 401, "token_missing")
}
