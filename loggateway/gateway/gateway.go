package gateway

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sync/semaphore"

	"github.com/gantry-gpu/gantry/shared/apierr"
	"github.com/gantry-gpu/gantry/shared/clock"
	"github.com/gantry-gpu/gantry/shared/correlation"
	"github.com/gantry-gpu/gantry/shared/obs"
)

// Service names the gateway in error envelopes and logs.
const Service = "gantry-loggateway"

// Options are the gateway's injected parts.
type Options struct {
	// Introspector validates node tokens (required). Production: NewControlPlane.
	Introspector Introspector
	// Sink receives accepted batches; nil builds Loki (LokiURL set) or File from Config.
	Sink   Sink
	Clock  clock.Clock
	Logger *slog.Logger
	// Version is the binary's version (main's -ldflags -X); exported with the commit Go
	// stamped as gantry_loggateway_build_info, which is how the control plane's releases
	// read learns what each gateway runs. "" reads as "unknown".
	Version string
}

// Gateway is the node log gateway's HTTP handler and what it holds.
type Gateway struct {
	cfg     Config
	auth    *authCache
	sink    Sink
	metrics *Metrics
	log     *slog.Logger
	clock   clock.Clock
	budget  *semaphore.Weighted
	errs    apierr.Writer
	bufs    buffers
	handler http.Handler
	metricz http.Handler
}

// New assembles a gateway from a validated configuration.
func New(cfg Config, opts Options) (*Gateway, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if opts.Introspector == nil {
		return nil, errors.New("gateway: an Introspector is required")
	}
	if opts.Clock == nil {
		opts.Clock = clock.Real{}
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	sink := opts.Sink
	if sink == nil {
		if cfg.LokiURL != "" {
			l := NewLoki(cfg.lokiPushURL(), cfg.LokiTenant, cfg.ForwardTimeout)
			l.Clock = opts.Clock
			sink = l
		} else {
			f, err := NewFile(cfg.FilePath)
			if err != nil {
				return nil, err
			}
			sink = f
		}
	}
	g := &Gateway{
		cfg:     cfg,
		auth:    newAuthCache(opts.Introspector, opts.Clock, cfg.AuthCacheTTL, cfg.AuthNegativeTTL, cfg.AuthCacheSize),
		sink:    sink,
		metrics: newMetrics(obs.ReadBuild(opts.Version)),
		log:     opts.Logger,
		clock:   opts.Clock,
		budget:  semaphore.NewWeighted(cfg.MemoryBudget),
		errs:    apierr.Writer{Service: Service},
	}
	g.metricz = promhttp.HandlerFor(g.metrics.Registry, promhttp.HandlerOpts{})
	mux := http.HandlerFunc(g.route)
	g.handler = correlation.Middleware(mux)
	return g, nil
}

// Handler serves the gateway's three paths.
func (g *Gateway) Handler() http.Handler { return g.handler }

// Metrics are the gateway's collectors (tests and the bench read them).
func (g *Gateway) Metrics() *Metrics { return g.metrics }

// Close releases the sink (flushing the development file).
func (g *Gateway) Close() error { return g.sink.Close() }

// Serve answers on ln until ctx ends, then drains in-flight pushes for at most the
// configured shutdown timeout.
func (g *Gateway) Serve(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{
		Handler:           g.handler,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       60 * time.Second,
		WriteTimeout:      60 * time.Second,
		IdleTimeout:       120 * time.Second,
		MaxHeaderBytes:    16 << 10,
		ErrorLog:          slog.NewLogLogger(g.log.Handler(), slog.LevelWarn),
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), g.cfg.ShutdownTimeout)
	defer cancel()
	err := srv.Shutdown(sctx)
	if serr := <-errc; serr != nil && !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	return err
}

func (g *Gateway) route(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.URL.Path == PushPath && r.Method == http.MethodPost:
		g.push(w, r)
	case r.URL.Path == "/healthz" && r.Method == http.MethodGet:
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		_, _ = w.Write([]byte("{\"status\":\"ok\"}\n"))
	case r.URL.Path == "/metrics" && r.Method == http.MethodGet:
		g.metricz.ServeHTTP(w, r)
	default:
		// Only log pushes pass: every other method or path is refused the same way.
		g.count(RejectedMethod)
		w.Header().Set("Allow", http.MethodPost)
		g.errs.Write(w, r, apierr.New(apierr.InvalidRequest, "the log gateway accepts only POST %s", PushPath).
			WithStatus(http.StatusMethodNotAllowed).With("reason", "method_not_allowed"))
	}
}

func (g *Gateway) count(o Outcome) { g.metrics.Batches.WithLabelValues(string(o)).Inc() }
