// Package apps owns the app catalog (docs/apps.md): apps by slug, their immutable
// versions (how each runs on a node), entitlements of tenants, and the admin operations
// that create, update and deprecate them. Other features ask it one question,
// LaunchVersion: may a caller of this tenant launch this version, and how does it run.
//
// Its subpackages own artifacts (apps/artifacts) and shared runtimes
// (apps/sharedruntimes); app instances (apps/instances) and the app proxy (apps/proxy)
// are separate features that use the catalog through LaunchVersion. The catalog never
// talks to nodes and never stores secrets: a version's environment is configuration.
package apps
