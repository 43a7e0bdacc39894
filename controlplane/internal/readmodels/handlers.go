// Package readmodels serves the v3 read models a web shell and an operator read
// (docs/operations.md; seed 2.4, 4.3; issue 21): the shell context, workloads, attention,
// platform ops signals, the admin ops overview and platform releases.
package readmodels

// Handlers implements the read-model operations of the contract.
type Handlers struct {
	Svc *Service
}

// Service computes the read models.
type Service struct{}
