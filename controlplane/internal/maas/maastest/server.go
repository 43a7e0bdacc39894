package maastest

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"time"
)

// apiPrefix is where MAAS serves API 2.0; gomaasclient builds it from the URL it is
// given ("http://host:5240/MAAS") plus "api/2.0/".
const apiPrefix = "/MAAS/api/2.0/"

// Version is what GET version/ reports.
const Version = "3.5.4"

// Durations of the timed steps. Zero means the step completes right after the call that
// started it returns (the response still shows the in-progress status, as MAAS's does).
type Durations struct {
	Commissioning, Testing, Deploying, Releasing time.Duration
	// QuickErase, SecureErase and FullErase are the Disk erasing step per erase mode.
	QuickErase, SecureErase, FullErase time.Duration
	// NodeTimeout is how long a Stalled step hangs before MAAS marks it failed (MAAS's
	// node_timeout: 30 minutes, the default here too).
	NodeTimeout time.Duration
}

// Config configures a Server.
type Config struct {
	// APIKeys are the accepted keys, "consumer_key:token_key:token_secret". Empty: one is
	// generated (APIKey returns it).
	APIKeys []string
	// User is the MAAS user the keys belong to (owner of allocated machines; default
	// "gantry").
	User      string
	Durations Durations
	// Booter boots deployed machines (nil: a deployed machine runs nothing).
	Booter Booter
	// Logger (default: discard).
	Logger *slog.Logger
}

// Call is one authenticated API request the simulator answered, for tests that assert
// which MAAS calls were made (and that no second deploy was).
type Call struct {
	Method, Path, Op, SystemID string
	Status                     int
}

// Server is a simulated MAAS region controller.
type Server struct {
	cfg Config
	log *slog.Logger

	mu       sync.Mutex
	keys     map[string]string // consumer:token → secret
	machines map[string]*machine
	calls    []Call
	seq      int
	closed   bool
	ctx      context.Context
	cancel   context.CancelFunc

	httpSrv *httptest.Server
}

// New builds a simulator; serve it with Handler, or Start it on a local port.
func New(cfg Config) *Server {
	if cfg.User == "" {
		cfg.User = "gantry"
	}
	if cfg.Durations.NodeTimeout == 0 {
		cfg.Durations.NodeTimeout = 30 * time.Minute
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{cfg: cfg, log: cfg.Logger.With("component", "maastest"), keys: map[string]string{}, machines: map[string]*machine{}, ctx: ctx, cancel: cancel}
	if len(cfg.APIKeys) == 0 {
		s.cfg.APIKeys = []string{NewAPIKey()}
	}
	for _, k := range s.cfg.APIKeys {
		if err := s.AddAPIKey(k); err != nil {
			panic(err)
		}
	}
	return s
}

// NewAPIKey returns a fresh key in MAAS's format (18:18:32 characters).
func NewAPIKey() string {
	return randString(18) + ":" + randString(18) + ":" + randString(32)
}

func randString(n int) string {
	const alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return string(b)
}

// APIKey is the first configured key.
func (s *Server) APIKey() string { return s.cfg.APIKeys[0] }

// AddAPIKey accepts another key from now on (a rotated credential).
func (s *Server) AddAPIKey(key string) error {
	parts := strings.Split(key, ":")
	if len(parts) != 3 || parts[0] == "" || parts[1] == "" || parts[2] == "" {
		return fmt.Errorf("maastest: an API key is consumer_key:token_key:token_secret")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.keys[parts[0]+":"+parts[1]] = parts[2]
	return nil
}

// RevokeAPIKey stops accepting key (401 from now on).
func (s *Server) RevokeAPIKey(key string) {
	parts := strings.Split(key, ":")
	if len(parts) != 3 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.keys, parts[0]+":"+parts[1])
}

// Start serves the simulator on a loopback port (TLS when tls is true) and returns the
// URL to give gomaasclient (ending in /MAAS).
func (s *Server) Start(tls bool) string {
	if tls {
		s.httpSrv = httptest.NewTLSServer(s.Handler())
	} else {
		s.httpSrv = httptest.NewServer(s.Handler())
	}
	return s.URL()
}

// URL is the base URL of a started simulator (http(s)://127.0.0.1:port/MAAS).
func (s *Server) URL() string {
	if s.httpSrv == nil {
		return ""
	}
	return s.httpSrv.URL + "/MAAS"
}

// TLSServer is the started httptest server (its Certificate() is the CA a client must
// trust when started with TLS).
func (s *Server) TLSServer() *httptest.Server { return s.httpSrv }

// Close stops every timer and boot and the HTTP server.
func (s *Server) Close() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	var boots []Instance
	for _, m := range s.machines {
		if m.timer != nil {
			m.timer.Stop()
		}
		m.gen++
		if b := m.halt(); b != nil {
			boots = append(boots, b)
		}
	}
	s.mu.Unlock()
	s.cancel()
	for _, b := range boots {
		_ = b.Stop()
	}
	if s.httpSrv != nil {
		s.httpSrv.Close()
	}
}

// AddMachine adds a machine and returns its system id.
func (s *Server) AddMachine(spec MachineSpec) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seq++
	if spec.SystemID == "" {
		spec.SystemID = strings.ToLower(randString(6))
	}
	if spec.Hostname == "" {
		spec.Hostname = "gpu-" + spec.SystemID
	}
	if spec.CPUCount == 0 {
		spec.CPUCount = 64
	}
	if spec.MemoryMiB == 0 {
		spec.MemoryMiB = 512 * 1024
	}
	if spec.Arch == "" {
		spec.Arch = "amd64/generic"
	}
	if spec.Pool == "" {
		spec.Pool = "default"
	}
	if spec.Zone == "" {
		spec.Zone = "default"
	}
	if spec.GPU == "" {
		spec.GPU = "mock-h100"
	}
	if spec.GPUCount == 0 && spec.GPU != "none" {
		spec.GPUCount = 8
	}
	if len(spec.IPAddresses) == 0 {
		spec.IPAddresses = []string{fmt.Sprintf("10.30.%d.%d", s.seq/250, s.seq%250+1)}
	}
	if _, dup := s.machines[spec.SystemID]; dup {
		panic("maastest: duplicate system id " + spec.SystemID)
	}
	status := StatusReady
	if spec.New {
		status = StatusNew
	}
	s.machines[spec.SystemID] = &machine{spec: spec, status: status, power: "off", commissioned: !spec.New, failures: map[Failure]bool{},
		storageLayout: DefaultStorageLayout}
	return spec.SystemID
}

// Inject arms a failure on a machine; it fires once (see Failure).
func (s *Server) Inject(systemID string, f Failure) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if m := s.machines[systemID]; m != nil {
		m.failures[f] = true
	}
}

// SetMissing marks a machine Missing (its BMC and network vanished: a running boot
// stops), or with false brings it back to the status it had.
func (s *Server) SetMissing(systemID string, missing bool) {
	s.mu.Lock()
	m := s.machines[systemID]
	if m == nil {
		s.mu.Unlock()
		return
	}
	var stop Instance
	switch {
	case missing && m.status != StatusMissing:
		m.gen++
		m.before = m.status
		m.set(StatusMissing, "Machine is missing: the rack controller cannot reach it")
		m.power = "unknown"
		stop = m.halt()
	case !missing && m.status == StatusMissing:
		m.set(m.before, "")
		m.power = "off"
	}
	s.mu.Unlock()
	if stop != nil {
		_ = stop.Stop()
	}
}

// Machine returns a snapshot of a machine.
func (s *Server) Machine(systemID string) (Machine, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.machines[systemID]
	if m == nil {
		return Machine{}, false
	}
	return m.snapshot(), true
}

// Machines returns snapshots of all machines, by system id.
func (s *Server) Machines() []Machine {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Machine
	for _, id := range sortedIDs(s.machines) {
		out = append(out, s.machines[id].snapshot())
	}
	return out
}

// Calls returns the authenticated calls answered so far.
func (s *Server) Calls() []Call {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Call(nil), s.calls...)
}

// WaitStatus polls until the machine has status want (or ctx ends).
func (s *Server) WaitStatus(ctx context.Context, systemID string, want Status) error {
	for {
		m, ok := s.Machine(systemID)
		if !ok {
			return fmt.Errorf("maastest: no machine %s", systemID)
		}
		if m.Status == want {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("maastest: machine %s is %s, not %s: %w", systemID, m.Status, want, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// apiError is a MAAS error: a plain-text body with a status.
type apiError struct {
	status int
	msg    string
}

func (e *apiError) Error() string { return e.msg }

func errf(status int, format string, args ...any) *apiError {
	return &apiError{status: status, msg: fmt.Sprintf(format, args...)}
}

// Handler serves the API.
func (s *Server) Handler() http.Handler {
	return http.HandlerFunc(s.serve)
}

const maxBody = 8 << 20

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	rest, ok := strings.CutPrefix(r.URL.Path, apiPrefix)
	if !ok {
		writeErr(w, errf(http.StatusNotFound, "Not Found"))
		return
	}
	parts := strings.Split(strings.Trim(rest, "/"), "/")
	op := r.URL.Query().Get("op")
	// GET version/ is anonymous in MAAS; everything else needs a valid signature.
	if r.Method == http.MethodGet && len(parts) == 1 && parts[0] == "version" {
		writeJSON(w, map[string]any{"version": Version, "subversion": "maastest", "capabilities": []string{"networks-management", "static-ipaddresses", "devices-management", "storage-deployment-ubuntu", "network-deployment-ubuntu"}})
		return
	}
	if err := s.authenticate(r); err != nil {
		writeErr(w, err)
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxBody)
	form, ferr := parseForm(r)
	call := Call{Method: r.Method, Path: r.URL.Path, Op: op}
	if len(parts) >= 2 && (parts[0] == "machines" || parts[0] == "nodes") {
		call.SystemID = parts[1]
	}
	var res any
	var err error
	if ferr != nil {
		err = ferr
	} else {
		res, err = s.route(r.Method, parts, op, form, r.URL.Query())
	}
	if err != nil {
		ae, ok := err.(*apiError)
		if !ok {
			ae = errf(http.StatusInternalServerError, "Internal server error")
		}
		call.Status = ae.status
		s.record(call)
		writeErr(w, ae)
		return
	}
	call.Status = http.StatusOK
	s.record(call)
	writeJSON(w, res)
}

func (s *Server) record(c Call) {
	s.mu.Lock()
	s.calls = append(s.calls, c)
	s.mu.Unlock()
}

// authenticate checks the OAuth 1.0a PLAINTEXT Authorization header: known consumer
// and token key, signature "<consumer secret (empty)>&<token secret>", a nonce and a
// timestamp present.
func (s *Server) authenticate(r *http.Request) *apiError {
	h := r.Header.Get("Authorization")
	rest, ok := strings.CutPrefix(h, "OAuth ")
	if !ok {
		return errf(http.StatusUnauthorized, "Authorization Error: 'Missing OAuth authorization'")
	}
	params := map[string]string{}
	for _, kv := range strings.Split(rest, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
		if !ok {
			continue
		}
		uv, err := url.QueryUnescape(strings.Trim(v, `"`))
		if err != nil {
			return errf(http.StatusUnauthorized, "Authorization Error: 'Malformed OAuth header'")
		}
		params[k] = uv
	}
	if params["oauth_signature_method"] != "PLAINTEXT" {
		return errf(http.StatusUnauthorized, "Authorization Error: 'Unsupported signature method'")
	}
	if params["oauth_nonce"] == "" || params["oauth_timestamp"] == "" {
		return errf(http.StatusUnauthorized, "Authorization Error: 'Missing nonce or timestamp'")
	}
	s.mu.Lock()
	secret, known := s.keys[params["oauth_consumer_key"]+":"+params["oauth_token"]]
	s.mu.Unlock()
	if !known {
		return errf(http.StatusUnauthorized, "Authorization Error: 'Invalid access token: %s'", params["oauth_token"])
	}
	if params["oauth_signature"] != "&"+secret {
		return errf(http.StatusUnauthorized, "Authorization Error: 'Invalid signature'")
	}
	return nil
}

// parseForm reads a POST or PUT body, multipart (gomaasclient with files) or
// urlencoded (gomaasclient without).
func parseForm(r *http.Request) (url.Values, *apiError) {
	if r.Method != http.MethodPost && r.Method != http.MethodPut {
		return url.Values{}, nil
	}
	ct, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	switch ct {
	case "multipart/form-data":
		if err := r.ParseMultipartForm(maxBody); err != nil {
			return nil, errf(http.StatusBadRequest, "Malformed multipart body")
		}
		return r.MultipartForm.Value, nil
	case "application/x-www-form-urlencoded", "":
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return nil, errf(http.StatusRequestEntityTooLarge, "Request body too large")
		}
		v, err := url.ParseQuery(string(body))
		if err != nil {
			return nil, errf(http.StatusBadRequest, "Malformed form body")
		}
		return v, nil
	default:
		return nil, errf(http.StatusUnsupportedMediaType, "Unsupported content type %s", ct)
	}
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

func writeErr(w http.ResponseWriter, e *apiError) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(e.status)
	_, _ = io.WriteString(w, e.msg)
}
