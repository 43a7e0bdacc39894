package proxy_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/apps/proxy"
	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
)

// testApp is the app an instance runs: this test binary started again as a process
// by the node's app supervisor (GANTRY_PROXY_TEST_APP=1, see TestMain), serving on
// the loopback port the agent gave it. Besides what the tests call through the proxy it
// answers /_last (what it saw of the last request), /_release and /_upload_state,
// which the test calls straight on the port.
type testApp struct {
	addr string
}

// appHandler is the test app (testAppMain runs it in its own process).
func appHandler() http.Handler {
	var (
		mu       sync.Mutex
		last     seenRequest
		release  = make(chan struct{})
		released sync.Once
		uploaded atomic.Bool
	)
	mux := http.NewServeMux()
	mux.HandleFunc("/_last", func(w http.ResponseWriter, _ *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		_ = json.NewEncoder(w).Encode(last)
	})
	mux.HandleFunc("/_release", func(http.ResponseWriter, *http.Request) { released.Do(func() { close(release) }) })
	mux.HandleFunc("/_upload_state", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, strconv.FormatBool(uploaded.Load()))
	})
	mux.HandleFunc("/health", func(http.ResponseWriter, *http.Request) {})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		last = seenRequest{Path: r.URL.Path, Query: r.URL.RawQuery, Host: r.Host, Header: r.Header.Clone()}
		mu.Unlock()
		switch r.URL.Path {
		case "/hello":
			http.SetCookie(w, &http.Cookie{Name: "appsession", Value: "s1", Path: "/", Domain: "example.com"})
			http.SetCookie(w, &http.Cookie{Name: "gantry_app_proxy", Value: "forged", Path: "/"})
			w.Header().Set("Content-Type", "text/plain")
			_, _ = io.WriteString(w, "hello from the app at "+r.URL.Path)
		case "/fail":
			http.Error(w, "the app failed", http.StatusInternalServerError)
		case "/redirect":
			http.Redirect(w, r, "/hello?x=1", http.StatusFound)
		case "/echo":
			w.Header().Set("Content-Type", "application/octet-stream")
			_, _ = io.Copy(w, r.Body)
		case "/upload":
			h := sha256.New()
			if _, err := io.CopyN(h, r.Body, mib); err != nil {
				http.Error(w, err.Error(), 400)
				return
			}
			uploaded.Store(true)
			n, _ := io.Copy(h, r.Body)
			_, _ = io.WriteString(w, hex.EncodeToString(h.Sum(nil))+" "+itoa(n+mib))
		case "/big":
			// The first MiB, then nothing more until the test has read it (/_release).
			w.Header().Set("Content-Type", "application/octet-stream")
			body := bigBody()
			if _, err := io.CopyN(w, body, mib); err != nil {
				return
			}
			w.(http.Flusher).Flush()
			select {
			case <-release:
			case <-r.Context().Done():
				return
			case <-time.After(waitLimit):
				return
			}
			_, _ = io.Copy(w, body)
		case "/ws":
			c, err := websocket.Accept(w, r, nil)
			if err != nil {
				return
			}
			defer c.CloseNow()
			c.SetReadLimit(4 << 20)
			for {
				typ, b, err := c.Read(r.Context())
				if err != nil {
					return
				}
				if err := c.Write(r.Context(), typ, b); err != nil {
					return
				}
			}
		default:
			http.NotFound(w, r)
		}
	})
	return mux
}

// testAppMain is the app process: serve appHandler on GANTRY_APP_PORT.
func testAppMain() {
	ln, err := net.Listen("tcp", "127.0.0.1:"+os.Getenv("GANTRY_APP_PORT"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	_ = http.Serve(ln, appHandler())
}

// seenRequest is what the app saw of a request.
type seenRequest struct {
	Path, Query, Host string
	Header            http.Header
}

// startApp launches the test app on node through its app supervisor and records the
// instance as running.
func (w *world) startApp(t testing.TB, node *gpuNode) (*testApp, uuid.UUID) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	id, addr := w.launchEnv(t, node, []string{self}, map[string]string{"GANTRY_PROXY_TEST_APP": "1"},
		&fabricv1.AppHealthCheck{Type: "http", HttpPath: "/health"})
	return &testApp{addr: addr}, id
}

func (a *testApp) call(t testing.TB, method, path string) string {
	t.Helper()
	req, _ := http.NewRequest(method, "http://"+a.addr+path, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

func (a *testApp) last(t testing.TB) seenRequest {
	t.Helper()
	var s seenRequest
	if err := json.Unmarshal([]byte(a.call(t, http.MethodGet, "/_last")), &s); err != nil {
		t.Fatal(err)
	}
	return s
}

// startInProcessApp serves appHandler in this process on a loopback port (the cases
// that need an app the supervisor does not run).
func startInProcessApp(t testing.TB) *testApp {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: appHandler()}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return &testApp{addr: ln.Addr().String()}
}

const (
	bigSize = 100 << 20
	mib     = 1 << 20
)

// bigBody is a deterministic 100 MiB pseudo-random stream.
func bigBody() io.Reader {
	r := rand.New(rand.NewPCG(1, 2))
	return io.LimitReader(readerFunc(func(p []byte) (int, error) {
		for i := range p {
			p[i] = byte(r.Uint32())
		}
		return len(p), nil
	}), bigSize)
}

type readerFunc func([]byte) (int, error)

func (f readerFunc) Read(p []byte) (int, error) { return f(p) }

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

func noRedirect(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

func TestProxyHTTP(t *testing.T) {
	w := newWorld(t)
	node := w.agentNode(t)
	app, id := w.startApp(t, node)
	base := w.URL + proxy.InstancePath(id)
	c := &http.Client{CheckRedirect: noRedirect}

	// Bearer: the app sees its own path, its own host, no Authorization, no Gantry cookie.
	req, _ := http.NewRequest(http.MethodGet, base+"hello?q=1", nil)
	req.Header.Set("Authorization", "Bearer "+w.Acme.AdminToken)
	req.Header.Set("Cookie", "gantry_refresh=secret; theme=dark; gantry_app_proxy=x")
	req.Header.Set("Connection", "keep-alive, X-Hop")
	req.Header.Set("X-Hop", "dropped")
	req.Header.Set("Proxy-Authorization", "Basic Zm9vOmJhcg==")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(body) != "hello from the app at /hello" {
		t.Fatalf("GET hello: %d %q", resp.StatusCode, body)
	}
	seen := app.last(t)
	if seen.Path != "/hello" || seen.Query != "q=1" || seen.Host != app.addr {
		t.Errorf("app saw path %q query %q host %q, want /hello, q=1 and %s", seen.Path, seen.Query, seen.Host, app.addr)
	}
	for _, h := range []string{"Authorization", "Proxy-Authorization", "X-Hop"} {
		if v := seen.Header.Get(h); v != "" {
			t.Errorf("app saw %s: %q", h, v)
		}
	}
	if got := seen.Header.Get("Cookie"); got != "theme=dark" {
		t.Errorf("app saw cookies %q, want only theme=dark", got)
	}
	if got := seen.Header.Get("X-Forwarded-Prefix"); got != strings.TrimSuffix(proxy.InstancePath(id), "/") {
		t.Errorf("X-Forwarded-Prefix %q", got)
	}
	if seen.Header.Get("X-Forwarded-For") == "" || seen.Header.Get("X-Forwarded-Host") == "" {
		t.Errorf("no X-Forwarded-For/Host: %v", seen.Header)
	}
	// The app's cookies are scoped to the instance; it cannot set Gantry's.
	sc := resp.Header.Values("Set-Cookie")
	if len(sc) != 1 || !strings.Contains(sc[0], "appsession=s1") || !strings.Contains(sc[0], "Path="+proxy.InstancePath(id)) ||
		strings.Contains(strings.ToLower(sc[0]), "domain") {
		t.Errorf("Set-Cookie %q", sc)
	}

	// Redirects stay under the instance's path.
	resp = do(t, c, http.MethodGet, base+"redirect", w.Acme.AdminToken, nil)
	resp.Body.Close()
	if loc := resp.Header.Get("Location"); resp.StatusCode != 302 || loc != proxy.InstancePath(id)+"hello?x=1" {
		t.Errorf("redirect: %d %q", resp.StatusCode, loc)
	}
	// Without the trailing slash: redirected to the directory.
	resp = do(t, c, http.MethodGet, strings.TrimSuffix(base, "/"), w.Acme.AdminToken, nil)
	resp.Body.Close()
	if resp.StatusCode != http.StatusPermanentRedirect || resp.Header.Get("Location") != proxy.InstancePath(id) {
		t.Errorf("no slash: %d %q", resp.StatusCode, resp.Header.Get("Location"))
	}
	// A request body goes through (POST echo), and the app's 404 is the app's.
	resp = do(t, c, http.MethodPost, base+"echo", w.Acme.AdminToken, strings.NewReader("ping"))
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(body) != "ping" {
		t.Errorf("echo: %d %q", resp.StatusCode, body)
	}
	resp = do(t, c, http.MethodGet, base+"nothing-here", w.Acme.AdminToken, nil)
	resp.Body.Close()
	if resp.StatusCode != 404 || strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		t.Errorf("app 404: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
}

func TestProxyStreams100MiB(t *testing.T) {
	w := newWorld(t)
	node := w.agentNode(t)
	app, id := w.startApp(t, node)
	base := w.URL + proxy.InstancePath(id)

	// Download: the first MiB arrives while the app still holds the other 99.
	resp := do(t, http.DefaultClient, http.MethodGet, base+"big", w.Acme.AdminToken, nil)
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("big: %d", resp.StatusCode)
	}
	got, want := sha256.New(), sha256.New()
	if _, err := io.CopyN(got, resp.Body, mib); err != nil {
		t.Fatal(err)
	}
	app.call(t, http.MethodPost, "/_release")
	n, err := io.Copy(got, resp.Body)
	if err != nil || n+mib != bigSize {
		t.Fatalf("download: %d bytes, %v", n+mib, err)
	}
	_, _ = io.Copy(want, bigBody())
	if !bytes.Equal(got.Sum(nil), want.Sum(nil)) {
		t.Fatal("download differs from what the app sent")
	}

	// Upload: the app has the first MiB while the client has not sent the rest.
	pr, pw := io.Pipe()
	go func() {
		src := bigBody()
		if _, err := io.CopyN(pw, src, mib); err != nil {
			pw.CloseWithError(err)
			return
		}
		for deadline := time.Now().Add(waitLimit); app.call(t, http.MethodGet, "/_upload_state") != "true"; time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				pw.CloseWithError(io.ErrUnexpectedEOF)
				return
			}
		}
		_, err := io.Copy(pw, src)
		pw.CloseWithError(err)
	}()
	req, _ := http.NewRequest(http.MethodPut, base+"upload", pr)
	req.Header.Set("Authorization", "Bearer "+w.Acme.AdminToken)
	req.ContentLength = -1
	up, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(up.Body)
	up.Body.Close()
	if want := hex.EncodeToString(want.Sum(nil)) + " " + itoa(bigSize); up.StatusCode != 200 || string(b) != want {
		t.Fatalf("upload: %d %q want %q", up.StatusCode, b, want)
	}
}

func TestProxyWebSocketEcho(t *testing.T) {
	w := newWorld(t)
	node := w.agentNode(t)
	_, id := w.startApp(t, node)
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	h := http.Header{}
	h.Set("Authorization", "Bearer "+w.Acme.AdminToken)
	ws, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(w.URL, "http")+proxy.InstancePath(id)+"ws", &websocket.DialOptions{HTTPHeader: h})
	if err != nil {
		t.Fatal(err)
	}
	ws.SetReadLimit(4 << 20)
	if n := w.Proxy.ActiveWebSockets(); n != 1 {
		t.Errorf("active websockets %d, want 1", n)
	}
	big := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
	for i, m := range []struct {
		typ websocket.MessageType
		b   []byte
	}{{websocket.MessageText, []byte("hello")}, {websocket.MessageBinary, big}, {websocket.MessageText, []byte("again")}} {
		if err := ws.Write(ctx, m.typ, m.b); err != nil {
			t.Fatal(err)
		}
		typ, b, err := ws.Read(ctx)
		if err != nil || typ != m.typ || !bytes.Equal(b, m.b) {
			t.Fatalf("message %d: %v %v %d bytes", i, err, typ, len(b))
		}
	}
	_ = ws.Close(websocket.StatusNormalClosure, "")
	eventually(t, "the proxied websocket to be released", func() bool { return w.Proxy.ActiveWebSockets() == 0 })
}

// cookieClient is a browser: a cookie jar, and redirects followed.
func cookieClient(t testing.TB) *http.Client {
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	return &http.Client{Jar: jar}
}

func TestProxyBrowserExchange(t *testing.T) {
	w := newWorld(t)
	node := w.agentNode(t)
	app, id := w.startApp(t, node)
	_, other := w.startApp(t, node)

	s, err := w.mint(t, w.Acme.AdminToken, id)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(s.URL, proxy.InstancePath(id)+"?gantry_proxy_code=") {
		t.Fatalf("url %q", s.URL)
	}
	// The exchange: a cookie scoped to the instance, then the app without the code.
	plain := &http.Client{CheckRedirect: noRedirect}
	resp := do(t, plain, http.MethodGet, w.URL+s.URL, "", nil)
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != proxy.InstancePath(id) {
		t.Fatalf("exchange: %d %q", resp.StatusCode, resp.Header.Get("Location"))
	}
	cs := resp.Cookies()
	if len(cs) != 1 || cs[0].Name != proxy.CookieName || !cs[0].HttpOnly || cs[0].SameSite != http.SameSiteStrictMode ||
		cs[0].Path != proxy.InstancePath(id) || cs[0].MaxAge <= 0 {
		t.Fatalf("cookie %+v", cs)
	}
	cookie := cs[0]
	// The cookie opens this instance, and the app never sees it.
	req, _ := http.NewRequest(http.MethodGet, w.URL+proxy.InstancePath(id)+"hello", nil)
	req.AddCookie(cookie)
	got, err := plain.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	got.Body.Close()
	if got.StatusCode != 200 || app.last(t).Header.Get("Cookie") != "" {
		t.Fatalf("with cookie: %d, app saw %q", got.StatusCode, app.last(t).Header.Get("Cookie"))
	}
	// ... not another instance (sent there by hand: a browser would not).
	req, _ = http.NewRequest(http.MethodGet, w.URL+proxy.InstancePath(other)+"hello", nil)
	req.AddCookie(cookie)
	got, err = plain.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	wantEnvelope(t, got, 401, "token_invalid")

	// Replayed code: refused, counted, no cookie.
	resp = do(t, plain, http.MethodGet, w.URL+s.URL, "", nil)
	if len(resp.Cookies()) != 0 {
		t.Fatalf("a replayed code set a cookie")
	}
	wantEnvelope(t, resp, 401, "token_invalid")
	// A code for one instance used on another's path: refused (and spent).
	s2, err := w.mint(t, w.Acme.AdminToken, id)
	if err != nil {
		t.Fatal(err)
	}
	wrong := strings.Replace(s2.URL, id.String(), other.String(), 1)
	wantEnvelope(t, do(t, plain, http.MethodGet, w.URL+wrong, "", nil), 401, "token_invalid")
	wantEnvelope(t, do(t, plain, http.MethodGet, w.URL+s2.URL, "", nil), 401, "token_invalid")
	// An unknown code.
	wantEnvelope(t, do(t, plain, http.MethodGet, w.URL+proxy.InstancePath(id)+"?gantry_proxy_code="+strings.Repeat("A", 43), "", nil), 401, "token_invalid")

	// A browser: the whole walk, redirect followed, cookie kept, query kept.
	s3, err := w.mint(t, w.Acme.AdminToken, id)
	if err != nil {
		t.Fatal(err)
	}
	b := cookieClient(t)
	u, _ := url.Parse(w.URL + s3.URL)
	q := u.Query()
	q.Set("tab", "2")
	u.RawQuery = q.Encode()
	resp = do(t, b, http.MethodGet, u.String(), "", nil)
	resp.Body.Close()
	if resp.StatusCode != 404 || resp.Request.URL.Query().Has("gantry_proxy_code") || resp.Request.URL.Query().Get("tab") != "2" {
		t.Fatalf("browser landed on %s with %d", resp.Request.URL, resp.StatusCode) // the app's own 404 for "/"
	}
	resp = do(t, b, http.MethodGet, w.URL+proxy.InstancePath(id)+"hello", "", nil)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("browser hello: %d", resp.StatusCode)
	}

	// Concurrent presentations of one code: exactly one wins.
	s4, err := w.mint(t, w.Acme.AdminToken, id)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	wins := 0
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequest(http.MethodGet, w.URL+s4.URL, nil)
			r, err := plain.Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			r.Body.Close()
			if r.StatusCode == http.StatusSeeOther {
				mu.Lock()
				wins++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if wins != 1 {
		t.Fatalf("%d presentations of one code won, want 1", wins)
	}
}

func TestProxyAuthMatrix(t *testing.T) {
	w := newWorld(t)
	node := w.agentNode(t)
	_, id := w.startApp(t, node)
	hello := w.URL + proxy.InstancePath(id) + "hello"
	c := http.DefaultClient

	viewer := w.member(t, "viewer")
	member := w.member(t, "member")
	_, outsider := w.NewUser(t, w.Acme.AdminToken, "member") // acme, not in the project
	globex := w.NewTenant(t, w.root, "Globex")

	for _, tc := range []struct {
		name, token string
		status      int
		code        string
	}{
		{"tenant admin", w.Acme.AdminToken, 200, ""},
		{"member", member, 200, ""},
		{"viewer (apps run code)", viewer, 403, "insufficient_permissions"},
		{"no credentials", "", 401, "token_missing"},
		{"garbage bearer", "not-a-token", 401, "token_invalid"},
		{"same tenant, not in the project", outsider, 403, "insufficient_permissions"},
		{"another tenant", globex.AdminToken, 404, "app_instance_not_found"},
		{"platform admin outside the tenant", w.root, 404, "app_instance_not_found"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp := do(t, c, http.MethodGet, hello, tc.token, nil)
			if tc.status == 200 {
				resp.Body.Close()
				if resp.StatusCode != 200 {
					t.Fatalf("%d", resp.StatusCode)
				}
				return
			}
			wantEnvelope(t, resp, tc.status, tc.code)
			if tc.status == 401 && !strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Bearer") {
				t.Errorf("401 without a challenge")
			}
		})
	}
	// Unknown instance, malformed id: 404 before anything else.
	wantEnvelope(t, do(t, c, http.MethodGet, w.URL+proxy.InstancePath(uuid.New())+"x", w.Acme.AdminToken, nil), 404, "app_instance_not_found")
	wantEnvelope(t, do(t, c, http.MethodGet, w.URL+"/api/v1/app-proxy/not-a-uuid/x", w.Acme.AdminToken, nil), 404, "app_instance_not_found")

	// A viewer cannot mint a browser code either (authorised before the body is read).
	if _, err := w.mint(t, viewer, id); err == nil {
		t.Error("a viewer minted a code")
	}
	// Another tenant cannot mint either (the server refuses its project header first;
	// the service itself refuses an instance of another project).
	if _, err := w.mint(t, globex.AdminToken, id); err == nil {
		t.Error("another tenant minted a code")
	}

	// The denials are audited (auth.denied, one row per actor, route and code).
	if err := w.App.Denials.FlushAll(context.Background()); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := w.Pool.QueryRow(context.Background(), `SELECT count(*) FROM audit_events WHERE action = 'auth.denied' AND metadata->>'route' = $1`, proxy.Route).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n < 3 {
		t.Errorf("%d auth.denied rows for the proxy, want at least 3 (missing, invalid, insufficient)", n)
	}
}

func TestProxyInstanceNotServing(t *testing.T) {
	w := newWorld(t)
	node := w.agentNode(t)
	_, id := w.startApp(t, node)
	hello := w.URL + proxy.InstancePath(id) + "hello"
	tok := w.Acme.AdminToken

	for _, st := range []string{"requested", "starting", "stopping", "stopped", "failed"} {
		w.setState(t, id, st)
		env := wantEnvelope(t, do(t, http.DefaultClient, http.MethodGet, hello, tok, nil), 503, "service_unavailable")
		if env.Details["reason"] != "app_instance_not_running" || env.Details["state"] != st || env.Details["route"] != proxy.Route {
			t.Errorf("%s: details %v", st, env.Details)
		}
		if _, err := w.mint(t, tok, id); err == nil || !strings.Contains(err.Error(), "not running") {
			t.Errorf("%s: mint %v, want app_instance_state_invalid", st, err)
		}
	}
	w.setState(t, id, "unhealthy") // still served
	resp := do(t, http.DefaultClient, http.MethodGet, hello, tok, nil)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("unhealthy: %d", resp.StatusCode)
	}

	// The app's port refuses connections: 502, at once.
	dead, _ := net.Listen("tcp", "127.0.0.1:0")
	deadAddr := dead.Addr().String()
	_ = dead.Close()
	down := w.instance(t, node, deadAddr, "running", "")
	env := wantEnvelope(t, do(t, http.DefaultClient, http.MethodGet, w.URL+proxy.InstancePath(down)+"x", tok, nil), 502, "upstream_error")
	if env.Details["reason"] != "app_unreachable" {
		t.Errorf("down: %v", env.Details)
	}
	// The node does not know the instance: 503.
	unknown := w.record(t, uuid.New(), uuid.New(), node, startInProcessApp(t).addr, "running", "", false) // not on the node
	env = wantEnvelope(t, do(t, http.DefaultClient, http.MethodGet, w.URL+proxy.InstancePath(unknown)+"x", tok, nil), 503, "service_unavailable")
	if env.Details["agent_error_code"] != "target_not_found" {
		t.Errorf("unknown on node: %v", env.Details)
	}
	// The node is offline (no agent ever connected): 503 node_offline.
	offline := w.instance(t, nil, startInProcessApp(t).addr, "running", "")
	env = wantEnvelope(t, do(t, http.DefaultClient, http.MethodGet, w.URL+proxy.InstancePath(offline)+"x", tok, nil), 503, "service_unavailable")
	if env.Details["reason"] != "node_offline" {
		t.Errorf("offline: %v", env.Details)
	}
}

func TestProxyAcrossReplicas(t *testing.T) {
	w := newWorld(t)
	node := w.agentNode(t) // its tunnel is held by ra
	_, id := w.startApp(t, node)
	b, pb, urlB := w.secondReplica(t, "rb")
	eventually(t, "replica rb to see the node on ra", func() bool {
		p, ok, err := b.Fabric.Presence(context.Background(), node.id)
		return err == nil && ok && p.Online && p.Replica == "ra"
	})
	resp := do(t, http.DefaultClient, http.MethodGet, urlB+proxy.InstancePath(id)+"hello", w.Acme.AdminToken, nil)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(body) != "hello from the app at /hello" {
		t.Fatalf("through rb: %d %q", resp.StatusCode, body)
	}
	// A WebSocket through rb, and a code minted on ra spent on rb (one bucket).
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	s, err := w.mint(t, w.Acme.AdminToken, id)
	if err != nil {
		t.Fatal(err)
	}
	br := cookieClient(t)
	r2 := do(t, br, http.MethodGet, urlB+s.URL, "", nil)
	r2.Body.Close()
	u, _ := url.Parse(urlB)
	cookies := br.Jar.Cookies(&url.URL{Scheme: "http", Host: u.Host, Path: proxy.InstancePath(id)})
	if len(cookies) != 1 {
		t.Fatalf("cookies after the exchange on rb: %v", cookies)
	}
	h := http.Header{}
	h.Set("Cookie", cookies[0].Name+"="+cookies[0].Value)
	ws, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(urlB, "http")+proxy.InstancePath(id)+"ws", &websocket.DialOptions{HTTPHeader: h})
	if err != nil {
		t.Fatal(err)
	}
	if err := ws.Write(ctx, websocket.MessageText, []byte("via rb")); err != nil {
		t.Fatal(err)
	}
	if _, m, err := ws.Read(ctx); err != nil || string(m) != "via rb" {
		t.Fatalf("echo via rb: %q %v", m, err)
	}
	_ = ws.Close(websocket.StatusNormalClosure, "")
	eventually(t, "rb's websocket released", func() bool { return pb.ActiveWebSockets() == 0 })
}
