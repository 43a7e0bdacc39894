package server

import (
	"github.com/gantry-gpu/gantry/controlplane/internal/allocations"
	"github.com/gantry-gpu/gantry/controlplane/internal/apps"
	"github.com/gantry-gpu/gantry/controlplane/internal/apps/artifacts"
	"github.com/gantry-gpu/gantry/controlplane/internal/apps/instances"
	"github.com/gantry-gpu/gantry/controlplane/internal/apps/proxy"
	"github.com/gantry-gpu/gantry/controlplane/internal/apps/sharedruntimes"
	"github.com/gantry-gpu/gantry/controlplane/internal/audit"
	"github.com/gantry-gpu/gantry/controlplane/internal/auth"
	"github.com/gantry-gpu/gantry/controlplane/internal/billing"
	"github.com/gantry-gpu/gantry/controlplane/internal/billing/accounts"
	"github.com/gantry-gpu/gantry/controlplane/internal/billing/invoices"
	"github.com/gantry-gpu/gantry/controlplane/internal/budgets"
	"github.com/gantry-gpu/gantry/controlplane/internal/catalog"
	"github.com/gantry-gpu/gantry/controlplane/internal/health"
	"github.com/gantry-gpu/gantry/controlplane/internal/maas"
	"github.com/gantry-gpu/gantry/controlplane/internal/maas/packages"
	"github.com/gantry-gpu/gantry/controlplane/internal/machineid"
	"github.com/gantry-gpu/gantry/controlplane/internal/nodemetrics"
	"github.com/gantry-gpu/gantry/controlplane/internal/nodes"
	"github.com/gantry-gpu/gantry/controlplane/internal/notifications"
	"github.com/gantry-gpu/gantry/controlplane/internal/observability"
	"github.com/gantry-gpu/gantry/controlplane/internal/payments"
	"github.com/gantry-gpu/gantry/controlplane/internal/platformops"
	"github.com/gantry-gpu/gantry/controlplane/internal/readmodels"
	"github.com/gantry-gpu/gantry/controlplane/internal/sshkeys"
	"github.com/gantry-gpu/gantry/controlplane/internal/storage"
	"github.com/gantry-gpu/gantry/controlplane/internal/storage/attach"
	"github.com/gantry-gpu/gantry/controlplane/internal/storage/objects"
	"github.com/gantry-gpu/gantry/controlplane/internal/tenancy"
	"github.com/gantry-gpu/gantry/controlplane/internal/terminal"
	"github.com/gantry-gpu/gantry/proto/api"
)

// API is the generated strict-server interface, assembled from the feature packages'
// slices of it. Adding an operation to the contract fails this assertion until a
// feature implements it.
type API struct {
	*HealthAPI
	*AuthAPI
	*TenancyAPI
	*SSHKeysAPI
	*AuditAPI
	*BillingAPI
	*BudgetsAPI
	*PaymentsAPI
	*NodesAPI
	*CatalogAPI
	*AllocationsAPI
	*TerminalAPI // browser terminal (docs/terminal.md)
	// NotificationsAPI is GET /ws/notifications (its upgrade runs in its StrictMiddleware).
	*NotificationsAPI
	// MachineIdentitiesAPI: service accounts, access credentials and the
	// client-credentials grant (its raw request comes through its StrictMiddleware).
	*MachineIdentitiesAPI
	// Object storage (docs/storage.md): buckets, grants and quota; objects; attachments
	// of buckets to allocations.
	*StorageAPI
	*StorageObjectsAPI
	*StorageAttachmentsAPI
	// ReadModelsAPI: the v3 shell, workloads, attention, platform ops and releases.
	*ReadModelsAPI
	// PlatformOpsAPI: platform signals, the admin ops overview and releases.
	*PlatformOpsAPI
	// ObservabilityAPI: the seed 4.2 read models, drills and runbooks.
	*ObservabilityAPI
	// NodeMetricsAPI: node agents' metrics through the fabric, and their discovery.
	*NodeMetricsAPI
	// Apps (docs/apps.md): the catalog and its administration, app instances, the
	// app-proxy exchange, shared runtimes and artifacts. The proxy itself
	// (ANY /api/v1/app-proxy/{app_instance_id}/*) is mounted beside the operations.
	*AppsAPI
	*AppInstancesAPI
	*AppProxyAPI
	*SharedRuntimesAPI
	*AppArtifactsAPI
	// BillingAccountsAPI: billing accounts and tenant pricing plans (docs/billing-accounts.md).
	*BillingAccountsAPI
	// InvoicesAPI: tenant and admin invoices (docs/invoices.md); the PDF answer reads
	// Accept in its StrictMiddleware.
	*InvoicesAPI
	// MaasAPI: MAAS sites, onboarding profiles, onboardings and decommissions (docs/maas.md).
	*MaasAPI
	// NodeAgentPackageAPI serves the node agent's Debian package to cloud-init.
	*NodeAgentPackageAPI
}

// Aliases give each embedded slice its own field name.
type (
	HealthAPI      = health.Handlers
	AuthAPI        = auth.Handlers
	TenancyAPI     = tenancy.Handlers
	SSHKeysAPI     = sshkeys.Handlers
	AuditAPI       = audit.Handlers
	BillingAPI     = billing.Handlers
	BudgetsAPI     = budgets.Handlers
	PaymentsAPI    = payments.Handlers
	NodesAPI       = nodes.Handlers
	CatalogAPI     = catalog.Handlers
	AllocationsAPI = allocations.Handlers
	TerminalAPI    = terminal.Handlers
	// NotificationsAPI: see notifications.Handlers.StrictMiddleware.
	NotificationsAPI      = notifications.Handlers
	MachineIdentitiesAPI  = machineid.Handlers
	StorageAPI            = storage.Handlers
	StorageObjectsAPI     = objects.Handlers
	StorageAttachmentsAPI = attach.Handlers
	ReadModelsAPI         = readmodels.Handlers
	PlatformOpsAPI        = platformops.Handlers
	ObservabilityAPI      = observability.Handlers
	NodeMetricsAPI        = nodemetrics.Handlers
	AppsAPI               = apps.Handlers
	AppInstancesAPI       = instances.Handlers
	AppProxyAPI           = proxy.Handlers
	SharedRuntimesAPI     = sharedruntimes.Handlers
	AppArtifactsAPI       = artifacts.Handlers
	BillingAccountsAPI    = accounts.Handlers
	InvoicesAPI           = invoices.Handlers
	MaasAPI               = maas.Handlers
	NodeAgentPackageAPI   = packages.Handlers
)

var _ api.StrictServerInterface = (*API)(nil)
