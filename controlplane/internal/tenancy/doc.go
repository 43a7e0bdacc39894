// Package tenancy owns tenants (organizations), their users, departments, projects and
// project membership: provisioning a tenant with its defaults, the project-access lookup
// the request chain runs on every project-scoped request, the one table of what each
// project role may do, and the HTTP handlers of the Users, Projects and tenant-admin
// operations.
//
// It must never decide authentication (the principal arrives in the context) nor write
// HTTP errors itself: it returns *apierr.Error and the server's mapper answers.
//
// Error codes where the contract has no dedicated code (seed §7.2):
//   - A slug already used (tenant, department, project) is 409 invalid_request with
//     details {field: slug, reason: slug_taken}; the contract describes these creates as
//     409, so projects follow departments and tenants rather than answering 422.
//   - A department, tenant or project member that does not exist (or belongs to another
//     tenant) is 404 invalid_request with details.reason not_found (members answer
//     user_not_found). A project create naming another tenant's department is the same
//     404 with details.field department_id, as the contract describes it.
//   - Rules about the current state are 409 invalid_request with details.reason:
//     default_project (deleting the default project), project_in_use, last_owner
//     (demoting or removing the last owner), default_department (disabling it).
//   - A project in a disabled department is refused with 422 validation_error,
//     details {field: department_id, reason: department_disabled}.
//   - Anything a caller may not do is insufficient_permissions (403), with
//     details.action naming the refused action; admin operations are admin_required.
package tenancy
