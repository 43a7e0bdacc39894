// Package app assembles the control plane from its configuration: connections,
// features, the HTTP surface and the background loops. It is the only place that knows
// every feature; cmd/gantry-controlplane, the API test harness and the benchmarks all
// start the control plane through it, so they exercise the same assembly.
package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/trace"

	"github.com/gantry-gpu/gantry/controlplane/internal/allocations"
	"github.com/gantry-gpu/gantry/controlplane/internal/apps"
	"github.com/gantry-gpu/gantry/controlplane/internal/apps/artifacts"
	"github.com/gantry-gpu/gantry/controlplane/internal/apps/instances"
	"github.com/gantry-gpu/gantry/controlplane/internal/apps/proxy"
	"github.com/gantry-gpu/gantry/controlplane/internal/apps/reports"
	"github.com/gantry-gpu/gantry/controlplane/internal/apps/sharedruntimes"
	"github.com/gantry-gpu/gantry/controlplane/internal/audit"
	"github.com/gantry-gpu/gantry/controlplane/internal/auth"
	"github.com/gantry-gpu/gantry/controlplane/internal/billing"
	"github.com/gantry-gpu/gantry/controlplane/internal/billing/accounts"
	"github.com/gantry-gpu/gantry/controlplane/internal/billing/invoices"
	"github.com/gantry-gpu/gantry/controlplane/internal/budgets"
	"github.com/gantry-gpu/gantry/controlplane/internal/catalog"
	"github.com/gantry-gpu/gantry/controlplane/internal/contract"
	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/fabric"
	"github.com/gantry-gpu/gantry/controlplane/internal/health"
	"github.com/gantry-gpu/gantry/controlplane/internal/idempotency"
	"github.com/gantry-gpu/gantry/controlplane/internal/jobs"
	"github.com/gantry-gpu/gantry/controlplane/internal/maas"
	"github.com/gantry-gpu/gantry/controlplane/internal/maas/packages"
	"github.com/gantry-gpu/gantry/controlplane/internal/machineid"
	"github.com/gantry-gpu/gantry/controlplane/internal/metrics"
	"github.com/gantry-gpu/gantry/controlplane/internal/nodemetrics"
	"github.com/gantry-gpu/gantry/controlplane/internal/nodes"
	"github.com/gantry-gpu/gantry/controlplane/internal/nodes/probe"
	"github.com/gantry-gpu/gantry/controlplane/internal/notifications"
	"github.com/gantry-gpu/gantry/controlplane/internal/observability"
	"github.com/gantry-gpu/gantry/controlplane/internal/outbox"
	"github.com/gantry-gpu/gantry/controlplane/internal/pagination"
	"github.com/gantry-gpu/gantry/controlplane/internal/payments"
	"github.com/gantry-gpu/gantry/controlplane/internal/platformops"
	"github.com/gantry-gpu/gantry/controlplane/internal/provisioning"
	"github.com/gantry-gpu/gantry/controlplane/internal/ratelimit"
	"github.com/gantry-gpu/gantry/controlplane/internal/readmodels"
	"github.com/gantry-gpu/gantry/controlplane/internal/server"
	"github.com/gantry-gpu/gantry/controlplane/internal/sshkeys"
	"github.com/gantry-gpu/gantry/controlplane/internal/storage"
	"github.com/gantry-gpu/gantry/controlplane/internal/storage/attach"
	"github.com/gantry-gpu/gantry/controlplane/internal/storage/blob"
	"github.com/gantry-gpu/gantry/controlplane/internal/storage/objects"
	"github.com/gantry-gpu/gantry/controlplane/internal/tenancy"
	"github.com/gantry-gpu/gantry/controlplane/internal/terminal"
	"github.com/gantry-gpu/gantry/proto/api"
	"github.com/gantry-gpu/gantry/proto/fabric/apptask"
	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
	"github.com/gantry-gpu/gantry/shared/clock"
	"github.com/gantry-gpu/gantry/shared/ids"
	"github.com/gantry-gpu/gantry/shared/obs"
)

// Options are the injectable parts; zero values mean production defaults.
type Options struct {
	Clock  clock.Clock
	IDs    ids.Source
	Tracer trace.TracerProvider
	// Pool reuses an existing pool (tests); else one is opened from Config.DatabaseURL.
	Pool *pgxpool.Pool
	// NodeProbeDialer and NodeProbeResolver replace the node probe's network seams
	// (tests: nodes on addresses the machine does not have). The policy still applies.
	NodeProbeDialer   probe.Dialer
	NodeProbeResolver probe.Resolver
	// Notifications replaces GANTRY_NOTIFICATIONS_* (tests); nil reads the environment.
	Notifications *notifications.Config
}

// App is an assembled control plane.
type App struct {
	Config   Config
	Log      *slog.Logger
	Clock    clock.Clock
	IDs      ids.Source
	Pool     *pgxpool.Pool
	NATS     *nats.Conn
	JS       jetstream.JetStream
	Metrics  *metrics.API
	Contract *contract.Contract
	Keys     *auth.Keyring
	Auth     *auth.Service
	Tenancy  *tenancy.Service
	SSHKeys  *sshkeys.Service
	// Nodes is node administration and the fabric's fleet.Directory; the fabric sets
	// Nodes.Presence, Nodes.Disconnector and Nodes.Fabric when it is assembled.
	Nodes *nodes.Service
	// Fabric is the node fabric server (docs/fabric.md): the tunnels of node agents,
	// presence, Dispatch and OpenStream toward nodes.
	Fabric *fabric.Server
	// Billing is balances, rating, pricing and runway; Billing.Ledger is the ledger
	// (payments credits top-ups through it, budgets reads Billing.Spent).
	Billing *billing.Service
	// Budgets is budget posture, evaluation and the launch decision (DecideLaunch).
	Budgets *budgets.Service
	// Accounts are the billing accounts (tenant, reseller, end customer).
	Accounts *accounts.Service
	// Invoices builds, issues and settles invoices.
	Invoices *invoices.Service
	// Allocations is GPU allocations (docs/allocations.md); it tells Nodes and the
	// catalog which GPUs and SKUs live allocations hold.
	Allocations *allocations.Service
	// Notifications is GET /ws/notifications and its publisher (docs/notifications.md).
	Notifications *notifications.Hub
	Idem          *idempotency.Store
	Relay         *outbox.Relay
	// Provisioning delivers allocation tasks to node agents from the PROVISIONING
	// stream (docs/provisioning.md); it runs in Run.
	Provisioning *provisioning.Dispatcher
	Payments     *payments.Service
	Handler      http.Handler
	// Terminal is the browser terminal (docs/terminal.md); it runs in Run.
	Terminal *terminal.Service
	// Denials aggregates every 401 and 403 into auth.denied audit rows; it runs in Run.
	Denials *audit.Denials
	// Storage is buckets, grants, quota and the storage access rule (docs/storage.md);
	// its sweeper runs in Run.
	Storage *storage.Service
	// Blob holds object bytes (GANTRY_STORAGE_DRIVER: fs or s3); Objects is the object
	// store over it (docs/storage.md).
	Blob    blob.Driver
	Objects *objects.Store
	// Attachments is buckets attached into allocations (docs/storage.md, Attachments);
	// its delivery sweep runs in Run.
	Attachments *attach.Service
	// Jobs is the replica's River client (docs/jobs.md): features register workers and
	// insert jobs in their transactions while New assembles them; it runs in Run.
	Jobs *jobs.Runner
	// Apps is the app catalog and entitlements (docs/apps.md).
	Apps *apps.Service
	// AppProxy is ANY /api/v1/app-proxy/{app_instance_id}/* (docs/app-proxy.md): not an
	// operation of the contract, so Handler does not route it; Run serves
	// AppProxy.Mount(Handler).
	AppProxy *proxy.Service
	// Limiter is the API's rate limiter; the app proxy checks its app_proxy group.
	Limiter *ratelimit.Limiter
	// Artifacts is app artifacts: file sets whose bytes go through Blob (docs/apps.md).
	Artifacts *artifacts.Service
	// Instances is app instances (docs/apps.md), driven by the agents' controller
	// reports (AppReports routes them) and task results; its reconcile pass runs in Run.
	Instances  *instances.Service
	AppReports *reports.Router
	// SharedRuntimes is shared runtimes: workers, attachments, operations, and the
	// metering of attached projects' calls through the app proxy (docs/apps.md).
	SharedRuntimes *sharedruntimes.Service
	// Maas is the bare-metal lifecycle through MAAS (docs/maas.md); its workflow steps
	// and scheduled sync are River jobs.
	Maas *maas.Service

	ownPool bool
	redis   *redis.Client
}

// New connects to PostgreSQL and NATS and assembles every feature. The database must
// already be migrated (db.Migrate).
func New(ctx context.Context, cfg Config, log *slog.Logger, opt Options) (*App, error) {
	a := &App{Config: cfg, Log: log, Clock: opt.Clock, IDs: opt.IDs, Pool: opt.Pool}
	if a.Clock == nil {
		a.Clock = clock.Real{}
	}
	if a.IDs == nil {
		a.IDs = ids.V7{}
	}
	tracer := opt.Tracer
	if tracer == nil {
		// No span exporter is configured yet: mint and propagate ids only.
		tracer = obs.NewIDTracerProvider()
	}
	ok := false
	defer func() {
		if !ok {
			a.Close()
		}
	}()

	if a.Pool == nil {
		pcfg, err := pgxpool.ParseConfig(cfg.DatabaseURL)
		if err != nil {
			return nil, fmt.Errorf("DATABASE_URL: %w", err)
		}
		db.ConfigurePool(pcfg)
		db.SetConnectTimeout(pcfg, cfg.DatabaseConnectTimeout)
		if a.Pool, err = pgxpool.NewWithConfig(ctx, pcfg); err != nil {
			return nil, fmt.Errorf("connect postgres: %w", err)
		}
		a.ownPool = true
	}
	var err error
	// Background jobs first: features register their workers while they are assembled.
	if a.Jobs, err = jobs.New(a.Pool, cfg.Jobs, log); err != nil {
		return nil, err
	}
	a.NATS, err = nats.Connect(cfg.NATSURL, nats.Name(server.ServiceName), nats.MaxReconnects(-1))
	if err != nil {
		return nil, fmt.Errorf("connect nats: %w", err)
	}
	if a.JS, err = jetstream.New(a.NATS, jetstream.WithPublishAsyncTimeout(outbox.PublishTimeout)); err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	if a.Contract, err = contract.Load(); err != nil {
		return nil, err
	}
	a.Metrics = metrics.New()

	// Identity.
	if a.Keys, err = auth.NewKeyring(a.Pool, cfg.Auth, a.Clock, a.IDs); err != nil {
		return nil, err
	}
	if err := a.Keys.EnsureActive(ctx); err != nil {
		return nil, fmt.Errorf("signing keys: %w", err)
	}
	a.Auth = auth.NewService(a.Pool, cfg.Auth, a.Keys, a.Clock, a.IDs)
	a.Metrics.Registry.MustRegister(a.Auth.Collectors()...) // sign-in backoff (docs/api.md)
	a.Tenancy = tenancy.New(a.Pool, a.Clock, a.IDs, auth.HashPassword)
	a.SSHKeys = sshkeys.New(a.Pool, a.Clock, a.IDs)
	a.Storage = storage.New(a.Pool, a.Clock, a.IDs, cfg.Storage, log)
	if err := a.Storage.Metrics.Register(a.Metrics.Registry); err != nil {
		return nil, fmt.Errorf("storage metrics: %w", err)
	}
	if a.Blob, err = blob.Open(cfg.Blob); err != nil {
		return nil, err
	}
	a.Objects = objects.New(a.Pool, a.Blob, objects.Limits{MaxBytes: a.Storage.Cfg.DefaultQuotaBytes, MaxObjects: a.Storage.Cfg.DefaultQuotaObjects},
		a.Clock, a.IDs, objects.Config{MaxObjectBytes: a.Storage.Cfg.MaxObjectBytes, UploadTTL: a.Storage.Cfg.UploadTTL}, log, a.Storage.Metrics)
	a.Storage.Blobs = a.Blob // the sweeper deletes what nothing references any more
	if a.Nodes, err = a.nodes(opt); err != nil {
		return nil, err
	}
	a.AppReports = reports.New(log)
	if a.Fabric, err = a.fabric(ctx); err != nil {
		return nil, err
	}
	a.Billing = billing.New(a.Pool, a.Clock, a.IDs, cfg.Billing.service())
	// Billing accounts and invoices (docs/billing-accounts.md, docs/invoices.md): the
	// invoice builder asks the accounts who sells to whom under which tax profile; the
	// period close runs as River jobs.
	a.Accounts = accounts.New(a.Pool, a.Clock, a.IDs)
	if a.Invoices, err = invoices.New(a.Pool, a.Clock, a.IDs, a.Billing.Ledger, a.Accounts, a.Metrics.Registry); err != nil {
		return nil, fmt.Errorf("invoices: %w", err)
	}
	a.Invoices.Register(a.Jobs, 0)

	a.Budgets = budgets.New(a.Pool, a.Clock, a.IDs, a.Billing, a.Tenancy)

	a.Apps = apps.New(a.Pool, a.Clock, a.IDs)
	if a.Artifacts, err = artifacts.New(a.Pool, a.Blob, a.Clock, a.IDs, a.Storage.Cfg.MaxObjectBytes, log, a.Metrics.Registry); err != nil {
		return nil, err
	}
	cat := catalog.New(a.Pool, a.Clock, a.IDs, catalog.BillingPrices{Billing: a.Billing, Clock: a.Clock}, catalog.NodesFleet{Nodes: a.Nodes})
	ac := cfg.Allocations
	a.Allocations = allocations.New(a.Pool, a.Clock, a.IDs, allocations.Config{MaxPerProject: ac.MaxPerProject, ProvisioningTimeout: ac.ProvisioningTimeout, ReportTimeout: ac.ReportTimeout,
		PlacementHintTTL:       ac.PlacementHintTTL,
		IdleUtilizationPercent: ac.IdleUtilizationPercent, IdleAfter: ac.IdleAfter, IdleSampleMaxAge: ac.IdleSampleMaxAge},
		cat, a.Nodes, a.SSHKeys, a.Budgets, a.Billing, log)
	a.Nodes.Allocations, cat.Usage, a.Allocations.Drains = a.Allocations, a.Allocations, a.Nodes
	a.Tenancy.ProjectInUse = a.Allocations.ProjectInUse // a project with live allocations is not deleted

	// App instances on allocations; the agents' reports reach them through the router
	// the fabric was given (fabric.Deps.OnControllerReport).
	a.Instances = instances.New(a.Pool, a.Clock, a.IDs, cfg.AppInstances.service(), instances.AppsCatalog{Apps: a.Apps}, a.Allocations, a.Fabric, log)
	a.Instances.Artifacts = a.Artifacts
	// Agents fetch the artifacts of their app instances over their own tunnels.
	a.Fabric.RegisterService(&fabricv1.AppArtifactFabric_ServiceDesc, &artifacts.FabricServer{Svc: a.Artifacts, NodeOf: fabric.NodeID})
	a.AppReports.Handle(apptask.Controller, a.Instances)
	a.SharedRuntimes = sharedruntimes.New(a.Pool, a.Clock, a.IDs, a.Apps, sharedruntimes.InstanceWorkers{Svc: a.Instances}, a.Tenancy, a.Billing, log)

	cursors := pagination.Codec{Key: a.cursorKey()}
	if a.Maas, err = a.maas(cat); err != nil {
		return nil, err
	}
	a.Idem = &idempotency.Store{Pool: a.Pool, Clock: a.Clock, Metrics: a.Metrics, Retention: cfg.IdempotencyRetention}
	if a.Denials, err = audit.NewDenials(a.Pool, a.Clock, a.IDs, log, audit.DenialConfig{}, a.Metrics.Registry); err != nil {
		return nil, err
	}
	limiter, err := a.limiter()
	if err != nil {
		return nil, err
	}
	a.Limiter = limiter
	a.Relay = &outbox.Relay{
		Pool: a.Pool, JS: a.JS, Clock: a.Clock, Logger: log,
		Stream: cfg.EventsStream, SubjectPrefix: cfg.EventsSubjectPrefix,
	}
	// The events stream exists before any consumer of it starts (the stop consumers, the
	// notifications), not only once the relay runs.
	if err := a.Relay.EnsureStream(ctx); err != nil {
		return nil, err
	}
	// Provisioning dispatch (docs/provisioning.md): the stream must exist before the relay
	// publishes to it (the relay stops at the first event it cannot publish).
	pc := cfg.provisioning()
	if err := provisioning.EnsureStream(ctx, a.JS, pc); err != nil {
		return nil, err
	}
	a.Relay.Routes = append(a.Relay.Routes, pc.Route())
	pm, err := provisioning.NewMetrics(a.Metrics.Registry)
	if err != nil {
		return nil, err
	}
	a.Provisioning = provisioning.New(a.JS, a.Allocations, a.Fabric, a.Clock, pc, pm, log)

	a.Payments = payments.MustNew(a.Pool, a.Clock, a.IDs, cfg.Payments.service(), a.Billing.Ledger, a.Metrics.Registry, log)
	// Notifications (docs/notifications.md): fed by the events stream and the notification
	// subjects; every replica gets every message and serves its own sockets.
	if a.Notifications, err = notifications.New(notifications.Deps{Config: opt.Notifications, NATS: a.NATS,
		EventsPrefix: cfg.EventsSubjectPrefix, SubjectPrefix: cfg.siblingSubjectPrefix("notifications"),
		Projects: a.Tenancy, Registry: a.Metrics.Registry, Clock: a.Clock, Log: log}); err != nil {
		return nil, err
	}
	// Browser terminal (docs/terminal.md): tokens, /ws/terminal, the bridge to the node's
	// agent over the fabric and the hop to the replica holding the node's tunnel.
	tc := cfg.Terminal
	if tc.ReplicaBucket == "" {
		tc.ReplicaBucket = cfg.EventsStream + "_TERMINAL_REPLICAS"
	}
	if a.Terminal, err = terminal.New(ctx, tc, terminal.Deps{Pool: a.Pool, Clock: a.Clock, IDs: a.IDs, Log: log,
		Allocations: terminal.AllocationsService{Svc: a.Allocations}, Fabric: a.Fabric, NATS: a.NATS, JS: a.JS,
		Registry: a.Metrics.Registry, RelayKey: cfg.Auth.MasterKey.Derive("gantry/terminal-relay"),
		EventsSubjectPrefix: cfg.EventsSubjectPrefix, Denials: a.Denials}); err != nil {
		return nil, err
	}
	// Observability read models (docs/operations.md): Prometheus and Alertmanager when
	// configured, and the control plane's own probes of what they do not scrape.
	obsSvc, err := observability.NewService(observability.DeployManifest(), cfg.Observability, a.Clock)
	if err != nil {
		return nil, err
	}
	obsSvc.Components = a.componentProbes()
	drills := &observability.Drills{Pool: a.Pool, Clock: a.Clock, IDs: a.IDs, Audit: &audit.Log{Clock: a.Clock, IDs: a.IDs},
		AM: obsSvc.AM, Manifest: obsSvc.Manifest, TokenFile: cfg.Observability.ReceiverTokenFile}
	obsSvc.Drills = drills
	// Node agents' metrics for Prometheus, scraped through the fabric; other replicas ask
	// this one for the tunnels it holds.
	nodeMetrics := &nodemetrics.Handlers{Config: cfg.NodeMetrics, Scraper: &nodemetrics.Scraper{Fabric: a.Fabric, NATS: a.NATS,
		SubjectPrefix: cfg.siblingSubjectPrefix("nodemetrics"), Timeout: cfg.NodeMetrics.Timeout, Log: log}}
	if err := nodeMetrics.Scraper.Serve(ctx); err != nil {
		return nil, err
	}
	// The app proxy (docs/app-proxy.md): exchange codes in a KV bucket every replica
	// shares, instance cookies signed with a key every replica derives alike.
	apc := cfg.AppProxy
	if apc.CodeBucket == "" || apc.CodeBucket == proxy.DefaultCodeBucket {
		apc.CodeBucket = cfg.EventsStream + "_APP_PROXY_CODES"
	}
	if a.AppProxy, err = proxy.New(apc, proxy.Deps{Instances: proxy.DBInstances{Pool: a.Pool},
		Auth: auth.NewAuthenticator(a.Keys, cfg.Auth, a.Clock), Projects: a.Tenancy, Streams: a.Terminal, JS: a.JS,
		CookieKey: cfg.Auth.MasterKey.Derive("gantry/app-proxy-cookie"), Denials: a.Denials,
		// Attached projects of a shared runtime get through to its workers and pay per call.
		Grants: a.SharedRuntimes, Meter: a.SharedRuntimes,
		// The API's limiter (Redis-backed, fail-open to memory), its app_proxy group per
		// principal: the proxy is mounted in front of the API chain.
		Limiter:  limiter,
		Registry: a.Metrics.Registry, Clock: a.Clock, Log: log}); err != nil {
		return nil, err
	}
	handlers := &server.API{
		HealthAPI:          &health.Handlers{Pool: a.Pool, NATS: a.NATS, Gatherer: a.Metrics.Registry, Clock: a.Clock},
		AuthAPI:            auth.NewHandlers(a.Auth, a.Keys, cfg.Auth, a.Tenancy).WithCursors(cursors),
		TenancyAPI:         tenancy.NewHandlers(a.Tenancy, a.Billing, cursors),
		SSHKeysAPI:         sshkeys.NewHandlers(a.SSHKeys, cursors),
		AuditAPI:           &audit.Handlers{Pool: a.Pool, Cursors: cursors},
		BillingAPI:         billing.NewHandlers(a.Billing, cursors),
		BudgetsAPI:         budgets.NewHandlers(a.Budgets),
		BillingAccountsAPI: accounts.NewHandlers(a.Accounts, cursors),
		InvoicesAPI:        invoices.NewHandlers(a.Invoices, cursors),
		PaymentsAPI:        payments.NewHandlers(a.Payments, cursors),
		NodesAPI:           nodes.NewHandlers(a.Nodes, cursors),
		CatalogAPI:         catalog.NewHandlers(cat, cursors),
		AllocationsAPI:     allocations.NewHandlers(a.Allocations, cursors),
		TerminalAPI:        a.Terminal.Handlers(),
		// The upgrade runs in NotificationsAPI.StrictMiddleware (below).
		NotificationsAPI: notifications.NewHandlers(a.Notifications, auth.NewAuthenticator(a.Keys, cfg.Auth, a.Clock), a.Denials, log),
		// Service accounts, access credentials, POST /api/v1/auth/token (docs/api.md).
		MachineIdentitiesAPI:  machineid.NewHandlers(machineid.New(a.Pool, a.Clock, a.IDs, a.Auth), cursors),
		StorageAPI:            storage.NewHandlers(a.Storage, cursors),
		StorageObjectsAPI:     objects.NewHandlers(a.Objects, a.Storage, cursors),
		StorageAttachmentsAPI: a.attachments(a.Objects, cursors),
		ReadModelsAPI:         readmodels.NewHandlers(a.readModels(cat), cursors),
		PlatformOpsAPI:        &platformops.Handlers{Svc: a.platformOps(a.Allocations.Config.ProvisioningTimeout, obsSvc.Prom)},
		ObservabilityAPI:      observability.NewHandlers(obsSvc, drills, cursors),
		NodeMetricsAPI:        nodeMetrics,
		AppsAPI:               apps.NewHandlers(a.Apps, cursors),
		AppInstancesAPI:       instances.NewHandlers(a.Instances, cursors),
		AppProxyAPI:           a.AppProxy.Handlers(),
		SharedRuntimesAPI:     sharedruntimes.NewHandlers(a.SharedRuntimes, cursors),
		AppArtifactsAPI:       artifacts.NewHandlers(a.Artifacts, cursors),
		MaasAPI:               maas.NewHandlers(a.Maas, cursors),
		NodeAgentPackageAPI:   packages.New(cfg.Maas.PackagePath),
	}
	a.Handler = server.New(server.Deps{
		Logger:            log,
		Contract:          a.Contract,
		API:               handlers,
		Auth:              auth.NewAuthenticator(a.Keys, cfg.Auth, a.Clock),
		NodeAuth:          a.Nodes,
		Projects:          a.Tenancy,
		Grants:            a.Storage,
		Idempotency:       a.Idem,
		Denials:           a.Denials,
		AuthzDenied:       a.Auth.AuthorizationDenied,
		Limiter:           limiter,
		Metrics:           a.Metrics,
		Tracer:            tracer,
		MaxBodyBytes:      cfg.MaxBodyBytes,
		RequestTimeout:    cfg.RequestTimeout,
		StrictMiddlewares: []api.StrictMiddlewareFunc{handlers.AuthAPI.StrictMiddleware, handlers.MachineIdentitiesAPI.StrictMiddleware, handlers.NotificationsAPI.StrictMiddleware, a.Terminal.StrictMiddleware, handlers.StorageObjectsAPI.StrictMiddleware, handlers.ObservabilityAPI.StrictMiddleware, nodeMetrics.StrictMiddleware, handlers.InvoicesAPI.StrictMiddleware},
	})
	ok = true
	return a, nil
}

func (a *App) limiter() (*ratelimit.Limiter, error) {
	groups, err := a.Config.RateLimitGroups()
	if err != nil {
		return nil, err
	}
	l := &ratelimit.Limiter{Groups: groups, Clock: a.Clock, FailOpen: a.Metrics.RateLimitFailOpen.Inc}
	if a.Config.RedisURL == "" {
		l.Store = ratelimit.NewMemory()
		return l, nil
	}
	// Bounded (no retries, short timeouts): a limiter that waits on a sick Redis slows
	// every request. While Redis is down this replica counts in memory.
	store, err := ratelimit.NewRedis(a.Config.RedisURL, "")
	if err != nil {
		return nil, err
	}
	a.redis = store.Client
	l.Store, l.Fallback = store, ratelimit.NewMemory()
	return l, nil
}

// fabric assembles the node fabric server over node administration's directory, and
// hands node administration its presence, disconnector and enrollment info.
func (a *App) fabric(ctx context.Context) (*fabric.Server, error) {
	fc := a.Config.Fabric
	cfg := fabric.Config{
		Addr: fc.Addr, PublicAddr: fc.PublicAddr, ReplicaID: fc.ReplicaID, CertNames: fc.CertNames,
		Bucket: fc.PresenceBucket, SubjectPrefix: fc.SubjectPrefix, DisableUDP: fc.DisableUDP, StartupTTL: fc.StartupTTL,
	}
	if cfg.Addr == "" {
		cfg.Addr = "127.0.0.1:0"
	}
	if cfg.Bucket == "" {
		cfg.Bucket = a.Config.EventsStream + "_FABRIC_PRESENCE"
	}
	if cfg.SubjectPrefix == "" {
		cfg.SubjectPrefix = a.Config.siblingSubjectPrefix("fabric")
	}
	if cfg.ReplicaID == "" {
		cfg.ReplicaID = fabric.DefaultReplicaID()
	}
	srv, err := fabric.New(ctx, cfg, fabric.Deps{
		Pool: a.Pool, SealKey: a.Config.Auth.MasterKey.Derive("gantry/fabric-pki"),
		NATS: a.NATS, JS: a.JS, Directory: a.Nodes, Clock: a.Clock, IDs: a.IDs, Log: a.Log,
		// Agents' task reports drive allocations (assembled after the fabric; sessions
		// only start in Run).
		OnTaskResult: func(ctx context.Context, nodeID uuid.UUID, r *fabricv1.TaskResult) error {
			// A storage task's result belongs to its attachment (the task id says so).
			if a.Attachments != nil {
				if handled, err := a.Attachments.OnTaskResult(ctx, nodeID, r); handled {
					return err
				}
			}
			// An app task's belongs to its app instance.
			if handled, err := a.appTaskResult(ctx, nodeID, r); handled {
				return err
			}
			if a.Allocations == nil {
				return errors.New("allocations not assembled")
			}
			return a.Allocations.OnTaskResult(ctx, nodeID, r)
		},
		// Agents' controller reports (app instances) go to their controller's service.
		OnControllerReport: func(ctx context.Context, nodeID uuid.UUID, r *fabricv1.ControllerReport) {
			if a.AppReports != nil {
				a.AppReports.OnControllerReport(ctx, nodeID, r)
			}
		},
		// Every (re)connect reconciles what the node holds against the database.
		OnHello: func(ctx context.Context, nodeID uuid.UUID, h *fabricv1.Hello) error {
			if a.Allocations == nil {
				return nil
			}
			return a.Allocations.Reconcile(ctx, nodeID, h)
		},
	})
	if err != nil {
		return nil, fmt.Errorf("fabric: %w", err)
	}
	a.Nodes.Presence, a.Nodes.Disconnector, a.Nodes.Fabric = srv, srv, srv
	return srv, nil
}

// nodes assembles node administration with the node-probe policy of the configuration.
func (a *App) nodes(opt Options) (*nodes.Service, error) {
	allowed, err := probe.ParseCIDRs(a.Config.Nodes.ProbeAllowedCIDRs)
	if err != nil {
		return nil, err
	}
	prober := probe.New(probe.Policy{Allowed: allowed}, a.Config.Nodes.ProbeTimeout)
	prober.Clock = a.Clock
	if opt.NodeProbeDialer != nil {
		prober.Dialer = opt.NodeProbeDialer
	}
	if opt.NodeProbeResolver != nil {
		prober.Resolver = opt.NodeProbeResolver
	}
	return nodes.New(a.Pool, a.Clock, a.IDs, prober, a.Config.Nodes.service(), a.Log), nil
}

// cursorKey signs cursors: the configured key, else one derived from the master key so
// that every replica agrees without more configuration.
func (a *App) cursorKey() []byte {
	if a.Config.CursorKey != "" {
		return []byte(a.Config.CursorKey)
	}
	return a.Config.Auth.MasterKey.Derive("gantry/pagination-cursor")
}

// Run serves HTTP on ln and runs the background loops until ctx ends, then drains.
func (a *App) Run(ctx context.Context, ln net.Listener) error {
	// No WriteTimeout (server.NewHTTPServer): GANTRY_REQUEST_TIMEOUT bounds the work and
	// a write deadline would cut the 503 it produces.
	srv := server.NewHTTPServer(a.AppProxy.Mount(a.Handler), server.HTTPOptions{Log: a.Log})
	bg, stopBG := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	wg.Add(4)
	go func() { defer wg.Done(); _ = a.Relay.Run(bg) }()
	// Background jobs (docs/jobs.md); with no worker registered there is nothing to run.
	go func() {
		defer wg.Done()
		if err := a.Jobs.Run(bg); err != nil && !errors.Is(err, jobs.ErrNoWorkers) {
			a.Log.ErrorContext(bg, "background jobs stopped", "err", err)
		}
	}()
	go func() { defer wg.Done(); a.Billing.Run(bg, a.Log) }()
	go func() { defer wg.Done(); a.maintain(bg) }()
	// Denied requests (docs/api.md, Audit): aggregated rows every window, the rest at stop.
	wg.Add(1)
	go func() { defer wg.Done(); a.Denials.Run(bg) }()
	// Budget evaluation (docs/budgets.md): every GANTRY_BUDGETS_EVALUATE_INTERVAL.
	wg.Add(1)
	go func() { defer wg.Done(); a.Budgets.Run(bg, a.Config.Budgets.EvaluateInterval, a.Log) }()
	// Allocations (docs/allocations.md): budget suspend and runway exhaustion stop running
	// allocations (one durable consumer shared by every replica), and idle detection
	// every GANTRY_ALLOCATIONS_IDLE_CHECK_INTERVAL, and tasks acknowledged but never
	// reported fail after GANTRY_ALLOCATIONS_REPORT_TIMEOUT.
	wg.Add(2)
	go func() {
		defer wg.Done()
		stops := &allocations.StopConsumer{Svc: a.Allocations, JS: a.JS, Stream: a.Config.EventsStream, SubjectPrefix: a.Config.EventsSubjectPrefix, Log: a.Log}
		if err := stops.Run(bg); err != nil {
			a.Log.ErrorContext(bg, "allocation stop consumer stopped", "err", err)
		}
	}()
	go func() { defer wg.Done(); a.Allocations.RunIdleDetection(bg, a.Config.Allocations.IdleCheckInterval) }()
	wg.Add(1)
	go func() { defer wg.Done(); a.Allocations.RunReportTimeouts(bg, a.Config.Allocations.ReportCheckInterval) }()
	// Storage attachments (docs/storage.md): redelivery, timeouts, catch-up.
	wg.Add(1)
	go func() { defer wg.Done(); a.Attachments.Run(bg) }()
	// App instances (docs/apps.md): start, stop, health timeouts, task delivery; shared
	// runtimes: worker state, operations, rating of metered calls.
	wg.Add(2)
	go func() { defer wg.Done(); a.Instances.Run(bg) }()
	go func() { defer wg.Done(); a.SharedRuntimes.Run(bg, a.Config.AppInstances.SharedRuntimeInterval) }()
	// Object storage (docs/storage.md): expired uploads, force-deleted buckets, blob GC.
	wg.Add(1)
	go func() { defer wg.Done(); a.Storage.RunSweeper(bg) }()
	// Provisioning dispatcher (docs/provisioning.md): every replica shares the consumer.
	wg.Add(1)
	go func() { defer wg.Done(); _ = a.Provisioning.Run(bg) }()
	// Node fabric (docs/fabric.md): agent tunnels until shutdown; agents reconnect.
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := a.Fabric.Run(bg); err != nil {
			a.Log.ErrorContext(bg, "fabric server stopped", "err", err)
		}
	}()

	// Browser terminal (docs/terminal.md): publishes this replica's relay address, ends
	// terminals of allocations that stop; detaches every terminal at shutdown.
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := a.Terminal.Run(bg, "http://"+ln.Addr().String()); err != nil {
			a.Log.ErrorContext(bg, "terminal stopped", "err", err)
		}
	}()
	errc := make(chan error, 1)
	go func() { errc <- server.Serve(srv, ln) }()
	var serveErr error
	select {
	case <-ctx.Done():
	case serveErr = <-errc:
	}
	shutCtx, cancel := context.WithTimeout(context.Background(), a.Config.ShutdownTimeout)
	defer cancel()
	shutErr := srv.Shutdown(shutCtx)
	stopBG()
	wg.Wait()
	if serveErr != nil && !errors.Is(serveErr, http.ErrServerClosed) {
		return serveErr
	}
	return shutErr
}

// maintain runs the periodic housekeeping: signing-key rotation, expiry of idempotency
// keys and refresh tokens, reconciliation of quiet payments with the provider, and
// pruning of long-published outbox events.
func (a *App) maintain(ctx context.Context) {
	t := time.NewTicker(10 * time.Minute)
	defer t.Stop()
	for {
		if _, err := a.Keys.RotateIfDue(ctx); err != nil && ctx.Err() == nil {
			a.Log.WarnContext(ctx, "signing key rotation failed", "err", err)
		}
		if _, err := a.Idem.Sweep(ctx); err != nil && ctx.Err() == nil {
			a.Log.WarnContext(ctx, "idempotency sweep failed", "err", err)
		}
		if _, err := a.Auth.PurgeExpiredRefreshTokens(ctx, a.Clock.Now()); err != nil && ctx.Err() == nil {
			a.Log.WarnContext(ctx, "refresh token purge failed", "err", err)
		}
		// Payments whose webhook never came (or failed to apply) are read back from the provider.
		if _, err := a.Payments.Reconcile(ctx); err != nil && ctx.Err() == nil {
			a.Log.WarnContext(ctx, "payments reconcile failed", "err", err)
		}
		if _, err := a.Relay.Prune(ctx); err != nil && ctx.Err() == nil {
			a.Log.WarnContext(ctx, "outbox prune failed", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Close releases connections.
func (a *App) Close() {
	if a.Notifications != nil { // before NATS: it unsubscribes and says goodbye to sockets
		a.Notifications.Close()
	}
	if a.AppProxy != nil { // its streams ride the fabric
		a.AppProxy.Close()
	}
	if a.Fabric != nil {
		a.Fabric.Close()
	}
	if a.NATS != nil {
		a.NATS.Close()
	}
	if a.redis != nil {
		_ = a.redis.Close()
	}
	if a.Blob != nil {
		_ = a.Blob.Close()
	}
	if a.ownPool && a.Pool != nil {
		a.Pool.Close()
	}
}

// componentProbes are the health snapshot's checks of what Prometheus does not scrape.
func (a *App) componentProbes() observability.ComponentProbes {
	p := observability.ComponentProbes{
		Database: func(ctx context.Context) error { return a.Pool.Ping(ctx) },
		EventBus: func(context.Context) error {
			if st := a.NATS.Status(); st != nats.CONNECTED {
				return fmt.Errorf("nats %s", st)
			}
			return nil
		},
		Gateway: func(context.Context) error {
			if a.Fabric == nil || a.Fabric.ListenAddr() == nil {
				return errors.New("fabric server not listening")
			}
			return nil
		},
		RuntimeCommit: observability.BuildCommit(),
	}
	if a.redis != nil {
		p.Cache = func(ctx context.Context) error { return a.redis.Ping(ctx).Err() }
	}
	return p
}

// readModels assembles the v3 read models (docs/operations.md): the shell context is
// cached in Redis when configured (shared by the replicas), else in this process.
func (a *App) readModels(cat *catalog.Service) *readmodels.Service {
	var cache readmodels.Cache
	if a.redis != nil {
		cache = readmodels.RedisCache{Client: a.redis, Prefix: "gantry:"}
	}
	regions := catalog.NewHandlers(cat, pagination.Codec{})
	return readmodels.New(readmodels.Deps{
		Pool: a.Pool, Clock: a.Clock, IDs: a.IDs, Log: a.Log, Billing: a.Billing, Tenancy: a.Tenancy, Balance: a.Billing, Cache: cache,
		Regions: readmodels.RegionsFunc(func(ctx context.Context) ([]api.V3Region, error) {
			r, err := regions.ListV3Regions(ctx, api.ListV3RegionsRequestObject{})
			if err != nil {
				return nil, err
			}
			return r.(api.ListV3Regions200JSONResponse).Body.Items, nil
		}),
	})
}

// platformOps assembles the platform signals, overview and releases.
// prom is Prometheus when configured (nil: the metrics-derived signals are unknown).
func (a *App) platformOps(provisioningTimeout time.Duration, prom *observability.Prometheus) *platformops.Service {
	replica := a.Config.Fabric.ReplicaID
	if replica == "" {
		replica = fabric.DefaultReplicaID() // what the fabric names this replica too
	}
	svc := &platformops.Service{Pool: a.Pool, Clock: a.Clock, Log: a.Log, ProvisioningTimeout: provisioningTimeout,
		Gatherer: a.Metrics.Registry, ReplicaID: replica, StartedAt: a.Clock.Now()}
	if prom != nil { // never a typed nil in the interface
		svc.Metrics = prom
	}
	return svc
}
