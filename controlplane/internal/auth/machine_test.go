package auth

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// TestMachineTokens: a machine token verifies into a principal that carries its
// credential and project roles and no capability; it never satisfies step-up, even when
// signed (by our own key) with amr and auth_time, and a mach claim beside a human's
// tenant role or platform role, a bad kind or an owner role is token_invalid.
func TestMachineTokens(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	user, tenant, cred, sa, proj := uuid.New(), uuid.New(), uuid.New(), uuid.New(), uuid.New()
	tok, exp, err := f.svc.SignMachineAccess(ctx, MachineGrant{UserID: user, Username: "sa-x", TenantID: tenant,
		Machine: principal.Machine{Kind: principal.MachineServiceAccount, ServiceAccountID: sa, CredentialID: cred,
			Projects: map[uuid.UUID]string{proj: "member"}}})
	if err != nil {
		t.Fatal(err)
	}
	if got := exp.Sub(f.clock.Now().Truncate(time.Second)); got != 15*time.Minute {
		t.Fatalf("machine token lives %v, want 15m", got)
	}
	p, err := f.authn.Verify(ctx, tok)
	if err != nil {
		t.Fatal(err)
	}
	if !p.IsMachine() || p.Machine.CredentialID != cred || p.Machine.ServiceAccountID != sa || p.Machine.Projects[proj] != "member" ||
		p.UserID != user || p.TenantID != tenant || p.TenantRole != "" || len(p.Capabilities) != 0 || p.StepUp {
		t.Fatalf("machine principal: %+v %+v", p, p.Machine)
	}
	// The cached principal cannot be widened through a returned copy.
	p.Machine.Projects[uuid.New()] = "admin"
	if again, _ := f.authn.Verify(ctx, tok); len(again.Machine.Projects) != 1 {
		t.Fatal("the verification cache shares the machine's project map")
	}

	base := func() accessClaims {
		c := f.claimsAt(user, f.clock.Now())
		c.PlatformRoles, c.TenantID = []string{}, tenant.String()
		c.Machine = &machineClaims{Kind: principal.MachineServiceAccount, ServiceAccountID: sa.String(), CredentialID: cred.String(),
			Projects: map[string]string{proj.String(): "member"}}
		return c
	}
	withAMR := base()
	at := f.clock.Now().Unix()
	withAMR.AMR, withAMR.AuthTime = []string{"pwd", "otp"}, &at
	tenantAdmin := base()
	tenantAdmin.TenantRole = "admin"
	platform := base()
	platform.PlatformRoles = []string{principal.RoleSuperadmin}
	owner := base()
	owner.Machine.Projects[proj.String()] = "owner"
	kind := base()
	kind.Machine.Kind = "robot"
	projTwo := base()
	projTwo.Machine.Kind, projTwo.Machine.ServiceAccountID = principal.MachineProjectCredential, ""
	projTwo.Machine.Projects[uuid.NewString()] = "viewer"
	for name, c := range map[string]accessClaims{"amr": withAMR, "tenant role": tenantAdmin, "platform role": platform,
		"owner role": owner, "unknown kind": kind, "project credential with two projects": projTwo} {
		t.Run(name, func(t *testing.T) {
			wantCode(t, f.authenticate(f.sign(t, c)), apierr.TokenInvalid)
		})
	}
}
