package authz

import (
	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/controlplane/internal/projectctx"
)

// Project roles, weakest first, as the table names them.
const (
	viewer = projectctx.RoleViewer
	member = projectctx.RoleMember
	admin  = projectctx.RoleAdmin
	owner  = projectctx.RoleOwner
)

// Operations is THE table of who may call each operation of the contract, keyed by its
// operationId. Every operation of proto/openapi/openapi.yaml has exactly one entry
// (TestTableMatchesContract); the chain refuses an operation without one. To add an
// operation: add its line here in the same change that adds it to the contract, with
// the weakest requirement that is still right; anything that depends on the object the
// handler loads (ownership, the role in a project named in the body) stays in the
// handler as well.
var Operations = map[string]Requirement{
	// Health, metrics and the contract itself.
	"getHealth":          Public("liveness probe"),
	"getReadiness":       Public("readiness probe"),
	"getOpenAPIDocument": Public("the published contract"),
	"getMetrics":         Public("Prometheus scrape endpoint"),
	"getInternalStats":   Capability(principal.CapOpsRead),

	// Sign-in.
	"signup":           Public("creates the account"),
	"login":            Public("the password is the credential"),
	"refreshToken":     Public("the refresh token in the body is the credential"),
	"logout":           Authenticated(),
	"getJWKS":          Public("public keys"),
	"refreshJWKS":      OwnCredential("the internal token, checked by auth.Handlers.StrictMiddleware"),
	"getMe":            Authenticated(),
	"listTenantUsers":  TenantAdmin(),
	"createTenantUser": TenantAdmin(),
	"getTenantUser":    TenantAdmin(),

	// MFA and step-up (auth/mfa.go, auth/stepup.go): the caller's own account.
	"stepUp":                   Authenticated(),
	"getAccountSecurity":       Authenticated(),
	"enrollTOTP":               Authenticated(), // replacing an active factor needs step-up: checked by the handler
	"verifyTOTP":               Authenticated(),
	"createMFARecoveryRequest": Authenticated(),
	"getMFAReadiness":          AdminCapability(principal.CapOpsRead),

	// Platform roles (auth/platformroles.go): changes need a fresh step-up.
	"listPlatformRoleBindings":  PlatformAdmin(),
	"createPlatformRoleBinding": PlatformAdmin().WithStepUp(),
	"deletePlatformRoleBinding": PlatformAdmin().WithStepUp(),

	// Admin users (auth/adminusers.go).
	"listAdminUsers":  PlatformAdmin(),
	"getAdminUser":    PlatformAdmin(),
	"updateAdminUser": PlatformAdmin(), // reset_mfa also needs step-up: checked by the service

	// Machine identities (machineid): service accounts are the tenant's, project access
	// credentials the project's; the grant authenticates the client itself.
	"issueAccessToken":               Public("the client id and secret in the form body or HTTP Basic, checked by the grant"),
	"listServiceAccounts":            TenantAdmin(),
	"createServiceAccount":           TenantAdmin(), // the projects named in the body must be the tenant's: checked by the handler
	"deleteServiceAccount":           TenantAdmin(),
	"createServiceAccountCredential": TenantAdmin(),
	"listProjectAccessCredentials":   ProjectRole(admin),
	"createProjectAccessCredential":  ProjectRole(admin),
	"deleteProjectAccessCredential":  ProjectRole(admin),
	"listAdminAccessCredentials":     PlatformAdmin(),
	"revokeAdminAccessCredential":    PlatformAdmin().WithStepUp(),
	// Enterprise sign-in, OIDC federation (auth/oidc.go; issue 19 item 6).
	"startOIDCSignIn":              Public("starts a sign-in at the tenant's identity provider"),
	"finishOIDCSignIn":             Public("the provider's code, the single-use state and the flow cookie are the credential"),
	"getTenantIdentityProvider":    PlatformAdmin(),
	"putTenantIdentityProvider":    PlatformAdmin(),
	"deleteTenantIdentityProvider": PlatformAdmin(),

	// Tenancy.
	"listDepartments":     TenantMember(),
	"createDepartment":    TenantAdmin(),
	"getDepartment":       TenantMember(),
	"updateDepartment":    TenantAdmin(),
	"listProjects":        Authenticated(),
	"createProject":       TenantMember(),
	"getProject":          ProjectRole(viewer),
	"updateProject":       ProjectRole(admin),
	"deleteProject":       ProjectRole(owner),
	"listProjectMembers":  ProjectRole(viewer),
	"addProjectMember":    ProjectRole(admin), // granting owner needs owner: checked by the handler
	"updateProjectMember": ProjectRole(admin), // touching an owner needs owner: checked by the handler
	"removeProjectMember": ProjectRole(admin), // removing an owner needs owner: checked by the handler
	"listTenants":         PlatformAdmin(),
	"createTenant":        PlatformAdmin(),
	"getTenant":           PlatformAdmin(),
	"updateTenant":        PlatformAdmin(),

	// SSH keys (the caller's own).
	"listSSHKeys":  Authenticated().ForMachines(),
	"createSSHKey": Authenticated().ForMachines(),
	"deleteSSHKey": Authenticated().ForMachines(),

	// Audit.
	"listAuditEvents": AdminCapability(principal.CapAuditRead),

	// Payments.
	"createPaymentTopUp":    TenantAdmin(),
	"listPayments":          TenantAdmin(),
	"receivePaymentWebhook": Public("the provider's signature, checked by the handler"),
	"listAdminPayments":     PlatformAdmin(),
	"createPaymentRefund":   PlatformAdmin(),

	// Budgets (a project budget's role is checked by the handler: the project is in the body).
	"listBillingBudgets":            TenantMember(),
	"createBillingBudget":           TenantMember(),
	"decideBillingBudget":           TenantMember(),
	"updateBillingBudget":           TenantMember(),
	"deleteBillingBudget":           TenantMember(),
	"acknowledgeBillingBudgetEvent": TenantMember(),
	"resolveBillingBudgetEvent":     TenantMember(),

	// Nodes.
	"listAdminNodes":            PlatformAdmin(),
	"createNode":                PlatformAdmin(),
	"getNode":                   PlatformAdmin(),
	"updateNode":                PlatformAdmin(),
	"deleteNode":                PlatformAdmin(),
	"probeNode":                 PlatformAdmin(),
	"createNodeEnrollmentToken": PlatformAdmin(),
	"cordonNode":                PlatformAdmin(),
	"uncordonNode":              PlatformAdmin(),
	"drainNode":                 PlatformAdmin(),
	"revokeNodeToken":           PlatformAdmin(),
	"getFleetTelemetry":         AdminCapability(principal.CapOpsRead),
	"listNodes":                 Capability(principal.CapNodeRead),
	"enrollNode":                Public("the one-use enrolment token in the body, checked by the handler"),
	"rotateNodeToken":           Node(),
	"introspectNodeToken":       Node(),

	// MAAS bare-metal lifecycle (docs/maas.md).
	"listMaasSites":               PlatformAdmin(),
	"createMaasSite":              PlatformAdmin(),
	"getMaasSite":                 PlatformAdmin(),
	"updateMaasSite":              PlatformAdmin(),
	"deleteMaasSite":              PlatformAdmin(),
	"syncMaasSite":                PlatformAdmin(),
	"listMaasMachines":            PlatformAdmin(),
	"rotateMaasSiteCredential":    PlatformAdmin(),
	"listMaasProfiles":            PlatformAdmin(),
	"createMaasProfile":           PlatformAdmin(),
	"getMaasProfile":              PlatformAdmin(),
	"updateMaasProfile":           PlatformAdmin(),
	"deleteMaasProfile":           PlatformAdmin(),
	"createMaasOnboarding":        PlatformAdmin(),
	"getMaasOnboarding":           PlatformAdmin(),
	"retryMaasOnboarding":         PlatformAdmin(),
	"abortMaasOnboarding":         PlatformAdmin(),
	"createNodeDecommission":      PlatformAdmin(),
	"getMaasDecommission":         PlatformAdmin(),
	"getNodeAgentPackage":         Public("the node agent package holds no secret; cloud-init fetches it before the machine has a credential"),
	"getNodeAgentPackageChecksum": Public("the checksum of the public node agent package"),

	// Billing.
	"getBillingBalance":               TenantMember(),
	"getBillingCurrencySettings":      TenantMember(),
	"getBillingAccount":               TenantMember(),
	"listBillingUsage":                TenantMember(),
	"recordBillingFXSnapshot":         PlatformAdmin(),
	"shadowRateBilling":               PlatformAdmin(),
	"createBillingAdjustment":         PlatformAdmin(),
	"reverseBillingLedgerTransaction": PlatformAdmin(),
	"listBillingPricingPlans":         PlatformAdmin(),
	"createBillingPricingPlan":        PlatformAdmin(),
	"createBillingPricingPlanVersion": PlatformAdmin(),
	// Billing accounts, tenant pricing plans and invoices (issue 24).
	"listBillingInvoices":      TenantMember(),
	"getBillingInvoice":        TenantMember(),
	"listBillingAccounts":      PlatformAdmin(),
	"createBillingAccount":     PlatformAdmin(),
	"getAdminBillingAccount":   PlatformAdmin(),
	"updateBillingAccount":     PlatformAdmin(),
	"assignTenantPricingPlan":  PlatformAdmin(),
	"listAdminBillingInvoices": PlatformAdmin(),
	"issueBillingInvoice":      PlatformAdmin(),
	"voidBillingInvoice":       PlatformAdmin(),
	"writeOffBillingInvoice":   PlatformAdmin(),

	// Catalog.
	"listAdminSkus":       PlatformAdmin(),
	"createSku":           PlatformAdmin(),
	"getAdminSku":         PlatformAdmin(),
	"updateSku":           PlatformAdmin(),
	"deleteSku":           PlatformAdmin(),
	"listAdminOsImages":   PlatformAdmin(),
	"createOsImage":       PlatformAdmin(),
	"getAdminOsImage":     PlatformAdmin(),
	"updateOsImage":       PlatformAdmin(),
	"deleteOsImage":       PlatformAdmin(),
	"createRegion":        PlatformAdmin(),
	"updateRegion":        PlatformAdmin(),
	"listCatalogSkus":     Authenticated().ForMachines(),
	"getCatalogSku":       Authenticated().ForMachines(),
	"listCatalogOsImages": Authenticated().ForMachines(),
	"listV3Regions":       Authenticated().ForMachines(),

	// Allocations.
	"listAllocations":        ProjectRole(viewer),
	"createAllocation":       ProjectRole(member),
	"getAllocation":          ProjectRole(viewer),
	"listAllocationEvents":   ProjectRole(viewer),
	"releaseAllocation":      ProjectRole(member),
	"restartAllocation":      ProjectRole(member),
	"listAllocationGroups":   ProjectRole(viewer),
	"createAllocationGroup":  ProjectRole(member),
	"getAllocationGroup":     ProjectRole(viewer),
	"releaseAllocationGroup": ProjectRole(member),
	"listAdminAllocations":   PlatformAdmin(),
	"forceReleaseAllocation": PlatformAdmin(),

	// v3 read models and platform operations (docs/operations.md; issue 21). Workloads are
	// the project's; the shell context and attention are the caller's own; platform signals,
	// releases and the observability read models need platform.ops.read (seed 4.2).
	"getV3ShellContext":           Authenticated(), // the optional X-Project-ID is checked by the handler
	"putV3NotificationReadMarker": Authenticated(),
	"listV3Workloads":             ProjectRole(viewer),
	"getV3Workload":               ProjectRole(viewer),
	"dismissV3Attention":          Authenticated(), // the key's workload must be visible to the caller: checked by the handler
	"getV3PlatformOps":            Capability(principal.CapOpsRead),
	"getV3PlatformSignal":         Capability(principal.CapOpsRead),
	"listPlatformReleases":        Capability(principal.CapOpsRead),
	"getAdminOpsOverview":         AdminCapability(principal.CapOpsRead),
	// Observability (controlplane/internal/observability).
	"listObservabilityAlerts":        Capability(principal.CapOpsRead),
	"getObservabilitySloEvidence":    Capability(principal.CapOpsRead),
	"getObservabilityHealthSnapshot": Capability(principal.CapOpsRead),
	"createObservabilityDrill":       Capability(principal.CapOpsWrite),
	"receiveAlertNotification":       OwnCredential("the alert receiver token, checked by observability.Handlers.StrictMiddleware"),
	"listNodeMetricsTargets":         OwnCredential("the node metrics token, checked by nodemetrics.Handlers.StrictMiddleware"),
	"getNodeMetrics":                 OwnCredential("the node metrics token, checked by nodemetrics.Handlers.StrictMiddleware"),
	"listAdminRunbooks":              AdminCapability(principal.CapOpsRunbookRead),
	"getAdminRunbook":                AdminCapability(principal.CapOpsRunbookRead),

	// Notifications and the browser terminal.
	"connectNotifications":  OwnCredential("the access token of the WebSocket handshake, checked by the notifications gateway"),
	"createTerminalSession": ProjectRole(member),
	"openTerminal":          OwnCredential("the single-use terminal token of the handshake, checked by the terminal gateway"),
	"relayTerminal":         OwnCredential("a replica's one-use relay token, checked by the terminal relay"),

	// SSH through the node tunnel (docs/ssh.md).
	"createSshSession": ProjectRole(member),
	"openSsh":          OwnCredential("the single-use SSH token of the handshake, checked by the terminal gateway"),
	// Object storage (docs/storage.md). X-Project-ID names the bucket's owner project.
	// Reading and writing objects is also open to holders of a grant on the bucket who
	// are not members of that project (ProjectRoleOrGrant: the chain asks the storage
	// service for the grant before anything is read). Deleting a bucket and changing who
	// may use it are for the project's admins, like an S3 bucket owner's policy.
	"listStorageBuckets":  ProjectRole(viewer),
	"createStorageBucket": ProjectRole(member),
	"getStorageBucket":    ProjectRoleOrGrant(viewer),
	"deleteStorageBucket": ProjectRole(admin),
	"listStorageObjects":  ProjectRoleOrGrant(viewer),
	"getStorageObject":    ProjectRoleOrGrant(viewer),
	"headStorageObject":   ProjectRoleOrGrant(viewer),
	"putStorageObject":    ProjectRoleOrGrant(member),
	"deleteStorageObject": ProjectRoleOrGrant(member),
	"listStorageGrants":   ProjectRole(viewer),
	"createStorageGrant":  ProjectRole(admin),
	"deleteStorageGrant":  ProjectRole(admin),
	"getStorageQuota":     ProjectRole(viewer),
	// The tenant default quota is the platform's to set (what a tenant pays for).
	"getTenantStorageQuota": PlatformAdmin(),
	"putTenantStorageQuota": PlatformAdmin(),
	// Attachments act on the allocation's project (X-Project-ID); the bucket's own
	// access (ownership or a grant, ro needs read, rw write) is checked by the handler.
	"listStorageAttachments":  ProjectRole(viewer),
	"createStorageAttachment": ProjectRole(member),
	"deleteStorageAttachment": ProjectRole(member),

	// Apps (docs/apps.md; issue 23). The catalog is read in a project (its tenant's
	// entitlements); instances, artifacts and attachments are the project's. Worker and
	// repair operations need the runtime's owner project (checked by the handler).
	"listApps":                           ProjectRole(viewer),
	"getAppVersion":                      ProjectRole(viewer),
	"listAppInstances":                   ProjectRole(viewer),
	"createAppInstance":                  ProjectRole(member),
	"getAppInstance":                     ProjectRole(viewer),
	"deleteAppInstance":                  ProjectRole(member),
	"createAppProxySession":              ProjectRole(member),
	"listSharedRuntimes":                 ProjectRole(viewer),
	"getSharedRuntime":                   ProjectRole(viewer),
	"listSharedRuntimeAttachments":       ProjectRole(viewer),
	"createSharedRuntimeAttachment":      ProjectRole(admin),
	"deleteSharedRuntimeAttachment":      ProjectRole(admin),
	"listSharedRuntimeWorkers":           ProjectRole(viewer),
	"listSharedRuntimeWorkerOperations":  ProjectRole(viewer),
	"createSharedRuntimeWorkerOperation": ProjectRole(admin),
	"getSharedRuntimeWorkerOperation":    ProjectRole(viewer),
	"listSharedRuntimeRepairOperations":  ProjectRole(viewer),
	"createSharedRuntimeRepairOperation": ProjectRole(admin),
	"getSharedRuntimeRepairOperation":    ProjectRole(viewer),
	"listAppArtifacts":                   ProjectRole(viewer),
	"createAppArtifact":                  ProjectRole(member),
	"getAppArtifact":                     ProjectRole(viewer),
	"putAppArtifactFile":                 ProjectRole(member),
	"getAppArtifactFile":                 ProjectRole(viewer),
	// The catalog and shared runtimes are the platform's to define.
	"createSharedRuntime":  PlatformAdmin(),
	"listAdminApps":        PlatformAdmin(),
	"createApp":            PlatformAdmin(),
	"updateApp":            PlatformAdmin(),
	"createAppVersion":     PlatformAdmin(),
	"updateAppVersion":     PlatformAdmin(),
	"listAppEntitlements":  PlatformAdmin(),
	"createAppEntitlement": PlatformAdmin(),
	"deleteAppEntitlement": PlatformAdmin(),
}
