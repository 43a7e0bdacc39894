package main

import (
	"context"
	"fmt"
	"net"
	"path/filepath"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/devenv"
	"github.com/gantry-gpu/gantry/controlplane/internal/nodes"
)

// devNodeName is the node `make dev` registers for its own agent on mock H100s.
const devNodeName = "dev-gpu-1"

// startDevAgent registers the dev node (once), mints a fresh enrollment token, enrolls a
// gantry-nodeagent with it and runs the agent on go-nvml's mock DGX H100 until ctx ends.
// It enrolls on every start: that is what an operator would do after wiping the agent's
// state, and it keeps working when the dev database was recreated in between.
func startDevAgent(ctx context.Context, svc *nodes.Service, kids *children, dir, url, gatewayURL string) (uuid.UUID, error) {
	node, err := findNode(ctx, svc, devNodeName)
	if err != nil {
		return uuid.Nil, err
	}
	region := devenv.DevRegion
	if node == uuid.Nil {
		n, err := svc.Create(ctx, nodes.Spec{Name: devNodeName, Address: hostAddress(), Region: &region})
		if err != nil {
			return uuid.Nil, fmt.Errorf("register the dev node: %w", err)
		}
		node = n.ID
	} else if n, err := svc.Get(ctx, node); err == nil && n.Region == nil {
		// A dev database from before the dev catalog existed: put the node in its region.
		if _, err := svc.Update(ctx, node, nodes.Patch{Region: &region}); err != nil {
			return uuid.Nil, fmt.Errorf("place the dev node in %s: %w", region, err)
		}
	}
	tok, err := svc.IssueEnrollmentToken(ctx, node)
	if err != nil {
		return uuid.Nil, fmt.Errorf("enrollment token: %w", err)
	}
	conf := filepath.Join(dir, "nodeagent", "nodeagent.conf")
	if err := kids.run(ctx, "gantry-nodeagent", []string{"GANTRY_NODEAGENT_ENROLLMENT_TOKEN=" + tok.Token},
		"enroll", "--config", conf, "--server", url, "--log-gateway", gatewayURL, "--hostname", devNodeName); err != nil {
		return uuid.Nil, err
	}
	return node, kids.start(ctx, "gantry-nodeagent", nil, "run", "--config", conf, "--gpu-backend", "mock-h100")
}

func findNode(ctx context.Context, svc *nodes.Service, name string) (uuid.UUID, error) {
	after := uuid.Nil
	for {
		page, err := svc.List(ctx, after, 200)
		if err != nil {
			return uuid.Nil, err
		}
		for _, n := range page.Items {
			if n.Name == name {
				return n.ID, nil
			}
			after = n.ID
		}
		if !page.More {
			return uuid.Nil, nil
		}
	}
}

// hostAddress is this machine's first non-loopback IPv4 address: the dev agent runs
// here, and node probes refuse loopback (an SSRF guard). Without one, a documentation
// address (TEST-NET-1) is registered; the probe then records it unreachable.
func hostAddress() string {
	addrs, err := net.InterfaceAddrs()
	if err == nil {
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok {
				if ip := ipn.IP.To4(); ip != nil && ip.IsGlobalUnicast() {
					return ip.String()
				}
			}
		}
	}
	return "192.0.2.1"
}
