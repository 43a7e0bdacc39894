package command

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/spf13/cobra"

	"github.com/gantry-gpu/gantry/cli/internal/apiclient"
	"github.com/gantry-gpu/gantry/cli/internal/output"
	"github.com/gantry-gpu/gantry/cli/internal/tty"
	"github.com/gantry-gpu/gantry/proto/api"
)

// pollEvery is how often --wait reads the allocation.
const pollEvery = time.Second

func (a *app) allocCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "alloc",
		Aliases: []string{"allocation", "allocations"},
		Short:   "Launch, inspect and release GPU allocations",
		Example: `  gantry alloc create --sku h100-80gb-sxm.1x --name train --wait
  gantry alloc list
  gantry alloc get train
  gantry alloc events train
  gantry alloc release train`,
	}
	cmd.AddCommand(a.allocCreateCmd(), a.allocListCmd(), a.allocGetCmd(), a.allocEventsCmd(), a.allocReleaseCmd())
	return cmd
}

func (a *app) allocCreateCmd() *cobra.Command {
	var sku, name, region string
	var keys []string
	var wait bool
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "create --sku SKU",
		Short: "Launch an allocation (with --wait, until it is active)",
		Long: `Launch an allocation of SKU in the project. Every SSH key of yours is put on it
unless --ssh-key names some. With --wait the command shows a live status line until the
allocation is active (exit 0) or has failed (exit 10); Ctrl-C stops waiting and leaves
the allocation running (exit 130).`,
		Example: `  gantry alloc create --sku h100-80gb-sxm.1x --wait
  gantry alloc create --sku h100-80gb-sxm.2x --name train --region dev-local --ssh-key laptop -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			if err := required(cmd, "sku"); err != nil {
				return err
			}
			s, err := a.session()
			if err != nil {
				return err
			}
			project, err := a.project(ctx, s)
			if err != nil {
				return err
			}
			body := api.CreateAllocationJSONRequestBody{Name: name, Sku: sku}
			if body.Name == "" {
				body.Name = strings.SplitN(sku, ".", 2)[0] + "-" + uuid.NewString()[:6]
			}
			if region != "" {
				body.RegionCode = &region
			}
			if len(keys) > 0 {
				all, err := listSSHKeys(cmd, s.API)
				if err != nil {
					return err
				}
				for _, ref := range keys {
					id, err := findKey(all, ref)
					if err != nil {
						return err
					}
					body.SSHKeyIds = append(body.SSHKeyIds, id)
				}
			}
			// One key for the command: a retried request cannot launch twice.
			idem := uuid.NewString()
			res, err := s.API.CreateAllocationWithResponse(ctx, &api.CreateAllocationParams{XProjectID: project, IdempotencyKey: &idem}, body)
			if err != nil {
				return err
			}
			if err := ok(res.HTTPResponse, res.Body); err != nil {
				return err
			}
			alloc := res.JSON201
			if wait {
				if alloc, err = a.waitFor(ctx, s, project, alloc, timeout, activeOrEnded); err != nil {
					return err
				}
			}
			if err := a.printer().Print(alloc, func(t *output.TableWriter) { allocPairs(t, alloc) }); err != nil {
				return err
			}
			if wait && alloc.Status != api.V3WorkloadStatusActive && alloc.Status != api.V3WorkloadStatusIdle {
				return &exitError{code: ExitFailed, err: fmt.Errorf("allocation %s is %s: %s", alloc.ID, alloc.Status, str(alloc.StatusReason))}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&sku, "sku", "", "SKU id (gantry sku list)")
	f.StringVar(&name, "name", "", "name of the allocation (default: the SKU's family and a random suffix)")
	f.StringVar(&region, "region", "", "region code (default: any region of the SKU with free GPUs)")
	f.StringSliceVar(&keys, "ssh-key", nil, "SSH key (id, name or fingerprint) to put on it; repeatable (default: all of yours)")
	f.BoolVar(&wait, "wait", false, "wait until the allocation is active, with a live status line")
	f.DurationVar(&timeout, "timeout", 15*time.Minute, "with --wait, stop waiting after this long (the allocation is left as it is)")
	return cmd
}

func findKey(keys []api.SSHKey, ref string) (uuid.UUID, error) {
	for _, k := range keys {
		if k.ID.String() == ref || k.Name == ref || k.Fingerprint == ref {
			return uuid.UUID(k.ID), nil
		}
	}
	return uuid.Nil, notFoundErr(fmt.Errorf("no SSH key %q (gantry ssh-key list)", ref))
}

func activeOrEnded(s api.V3WorkloadStatus) bool {
	switch s {
	case api.V3WorkloadStatusActive, api.V3WorkloadStatusIdle, api.V3WorkloadStatusFailed, api.V3WorkloadStatusReleased,
		api.V3WorkloadStatusCompleted, api.V3WorkloadStatusReleaseFailed, api.V3WorkloadStatusStopped:
		return true
	}
	return false
}

func releasedOrStuck(s api.V3WorkloadStatus) bool {
	switch s {
	case api.V3WorkloadStatusReleased, api.V3WorkloadStatusFailed, api.V3WorkloadStatusCompleted, api.V3WorkloadStatusReleaseFailed:
		return true
	}
	return false
}

// waitFor polls the allocation until done(status), drawing a live status line on a
// terminal (a line per change otherwise). Ctrl-C (the context) stops the wait only.
func (a *app) waitFor(ctx context.Context, s *apiclient.Session, project uuid.UUID, alloc *api.Allocation, timeout time.Duration, done func(api.V3WorkloadStatus) bool) (*api.Allocation, error) {
	return waitUntil(ctx, a, alloc, timeout, waitSpec[*api.Allocation]{
		noun: "allocation",
		show: func(al *api.Allocation) (string, string, string) { return al.Name, al.ID.String(), string(al.Status) },
		done: func(al *api.Allocation) bool { return done(al.Status) },
		get: func(ctx context.Context) (*api.Allocation, error) {
			res, err := s.API.GetAllocationWithResponse(ctx, alloc.ID, &api.GetAllocationParams{XProjectID: project})
			if err != nil {
				return nil, err
			}
			if err := ok(res.HTTPResponse, res.Body); err != nil {
				return nil, err
			}
			return res.JSON200, nil
		},
		left: func(al *api.Allocation) string {
			return fmt.Sprintf("gantry alloc get %s; gantry alloc release %s", al.ID, al.ID)
		},
	})
}

// waitSpec says how waitUntil reads and shows one kind of thing being waited for.
type waitSpec[T any] struct {
	noun string                           // "allocation", "app instance"
	show func(T) (name, id, state string) // what the status line shows
	done func(T) bool                     // the wait is over
	get  func(context.Context) (T, error) // a fresh read
	left func(T) string                   // how to go on after Ctrl-C
}

// waitUntil polls until spec.done, drawing a live status line on a terminal (a line per
// change otherwise). Ctrl-C (the context) stops the wait only: the thing keeps going and
// the command exits 130; the timeout leaves it as it is with exit 1.
func waitUntil[T any](ctx context.Context, a *app, cur T, timeout time.Duration, spec waitSpec[T]) (T, error) {
	var zero T
	live := false
	if f, isFile := a.errOut.(*os.File); isFile && tty.IsTerminal(int(f.Fd())) {
		live = true
	}
	start := time.Now()
	deadline := start.Add(timeout)
	last := ""
	spin := []string{"|", "/", "-", "\\"}
	tick := time.NewTicker(pollEvery)
	defer tick.Stop()
	endLine := func() {
		if live {
			fmt.Fprintln(a.errOut)
		}
	}
	for i := 0; ; i++ {
		name, id, state := spec.show(cur)
		if live {
			fmt.Fprintf(a.errOut, "\r\033[K%s %s %s: %s (%s)", spin[i%len(spin)], name, id, state, time.Since(start).Truncate(time.Second))
		} else if state != last {
			fmt.Fprintf(a.errOut, "%s %s: %s\n", name, id, state)
		}
		last = state
		if spec.done(cur) {
			endLine()
			return cur, nil
		}
		select {
		case <-ctx.Done():
			endLine()
			fmt.Fprintf(a.errOut, "Stopped waiting: %s %s is %s and keeps going (%s).\n", spec.noun, id, state, spec.left(cur))
			return zero, &exitError{code: ExitInterrupted, quiet: true}
		case <-tick.C:
		}
		if time.Now().After(deadline) {
			endLine()
			return zero, &exitError{code: ExitError, err: fmt.Errorf("%s %s still %s after %s; it is left as it is", spec.noun, id, state, timeout)}
		}
		next, err := spec.get(ctx)
		if err != nil {
			if ctx.Err() != nil {
				continue // Ctrl-C during the read: the select above reports it
			}
			return zero, err
		}
		cur = next
	}
}

// resolveAlloc finds ALLOC by id, or by name among the project's allocations (a live
// one wins over ended ones of the same name).
func (a *app) resolveAlloc(ctx context.Context, s *apiclient.Session, project uuid.UUID, ref string) (uuid.UUID, error) {
	if id, err := uuid.Parse(ref); err == nil {
		return id, nil
	}
	all, err := listAllocs(ctx, s, project)
	if err != nil {
		return uuid.Nil, err
	}
	return pickByName(all, ref, "allocation", "gantry alloc list",
		func(al api.Allocation) (string, uuid.UUID, bool) { return al.Name, uuid.UUID(al.ID), al.EndedAt == nil })
}

// pickByName finds the one item named ref: a live one wins over ended ones of the same
// name; none is not found (exit 5), several is a usage error asking for the id. view
// gives an item's name, id and whether it is live.
func pickByName[T any](items []T, ref, noun, listCmd string, view func(T) (name string, id uuid.UUID, live bool)) (uuid.UUID, error) {
	var live, ended []uuid.UUID
	for _, it := range items {
		name, id, isLive := view(it)
		switch {
		case name != ref:
		case isLive:
			live = append(live, id)
		default:
			ended = append(ended, id)
		}
	}
	pick := live
	if len(pick) == 0 {
		pick = ended
	}
	switch len(pick) {
	case 0:
		return uuid.Nil, notFoundErr(fmt.Errorf("no %s named %q in the project (%s)", noun, ref, listCmd))
	case 1:
		return pick[0], nil
	}
	return uuid.Nil, usageErr(fmt.Errorf("%d %ss are named %q: use the id", len(pick), noun, ref))
}

func listAllocs(ctx context.Context, s *apiclient.Session, project uuid.UUID) ([]api.Allocation, error) {
	out := []api.Allocation{}
	var cursor *string
	for {
		res, err := s.API.ListAllocationsWithResponse(ctx, &api.ListAllocationsParams{XProjectID: project, Cursor: cursor})
		if err != nil {
			return nil, err
		}
		if err := ok(res.HTTPResponse, res.Body); err != nil {
			return nil, err
		}
		out = append(out, res.JSON200.Items...)
		if cursor = res.JSON200.Pagination.NextCursor; cursor == nil {
			return out, nil
		}
	}
}

func (a *app) allocListCmd() *cobra.Command {
	var live bool
	cmd := &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List the project's allocations",
		Example: `  gantry alloc list
  gantry alloc list --live
  gantry alloc list -o json | jq -r '.[] | select(.status=="active") | .id'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, err := a.session()
			if err != nil {
				return err
			}
			project, err := a.project(cmd.Context(), s)
			if err != nil {
				return err
			}
			all, err := listAllocs(cmd.Context(), s, project)
			if err != nil {
				return err
			}
			items := make([]api.Allocation, 0, len(all))
			for _, al := range all {
				if !live || al.EndedAt == nil {
					items = append(items, al)
				}
			}
			return a.printer().Print(items, func(t *output.TableWriter) {
				t.Row("ID", "NAME", "SKU", "STATUS", "REGION", "HOURLY", "COST", "CREATED")
				for _, al := range items {
					t.Row(al.ID.String(), al.Name, al.Sku, string(al.Status), al.RegionCode, moneyPtr(al.HourlyRate), moneyPtr(al.AccruedCost), ts(al.CreatedAt))
				}
			})
		},
	}
	cmd.Flags().BoolVar(&live, "live", false, "only allocations that have not ended")
	return cmd
}

func (a *app) allocGetCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "get ALLOC",
		Short: "Show one allocation (by id or name), with how to connect",
		Example: `  gantry alloc get train
  gantry alloc get 0193a0c4-7f2e-7c1d-8e4b-5a6f7d8e9f00 -o yaml`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			s, project, id, err := a.allocArg(ctx, args[0])
			if err != nil {
				return err
			}
			res, err := s.API.GetAllocationWithResponse(ctx, id, &api.GetAllocationParams{XProjectID: project})
			if err != nil {
				return err
			}
			if err := ok(res.HTTPResponse, res.Body); err != nil {
				return err
			}
			return a.printer().Print(res.JSON200, func(t *output.TableWriter) { allocPairs(t, res.JSON200) })
		},
	}
}

func (a *app) allocArg(ctx context.Context, ref string) (*apiclient.Session, uuid.UUID, uuid.UUID, error) {
	s, err := a.session()
	if err != nil {
		return nil, uuid.Nil, uuid.Nil, err
	}
	project, err := a.project(ctx, s)
	if err != nil {
		return nil, uuid.Nil, uuid.Nil, err
	}
	id, err := a.resolveAlloc(ctx, s, project, ref)
	return s, project, id, err
}

func allocPairs(t *output.TableWriter, al *api.Allocation) {
	conn := ""
	if al.Connection != nil {
		conn = fmt.Sprintf("%s@%s:%d", al.Connection.User, al.Connection.Host, al.Connection.Port)
	}
	t.Pairs("ID", al.ID.String(), "Name", al.Name, "Status", string(al.Status), "Reason", str(al.StatusReason),
		"SKU", al.Sku, "GPUs", fmt.Sprintf("%dx %s", al.GpuCount, al.GpuModel), "Region", al.RegionCode,
		"Node", al.NodeID.String(), "Hourly rate", moneyPtr(al.HourlyRate), "Accrued cost", moneyPtr(al.AccruedCost),
		"Connection", conn, "Created", ts(al.CreatedAt), "Active since", tsPtr(al.ActiveAt), "Ended", tsPtr(al.EndedAt))
}

func (a *app) allocEventsCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "events ALLOC",
		Short: "List an allocation's transitions with reason and actor",
		Example: `  gantry alloc events train
  gantry alloc events train -o json`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			s, project, id, err := a.allocArg(ctx, args[0])
			if err != nil {
				return err
			}
			items := []api.AllocationEvent{}
			var cursor *string
			for {
				res, err := s.API.ListAllocationEventsWithResponse(ctx, id, &api.ListAllocationEventsParams{XProjectID: project, Cursor: cursor})
				if err != nil {
					return err
				}
				if err := ok(res.HTTPResponse, res.Body); err != nil {
					return err
				}
				items = append(items, res.JSON200.Items...)
				if cursor = res.JSON200.Pagination.NextCursor; cursor == nil {
					break
				}
			}
			return a.printer().Print(items, func(t *output.TableWriter) {
				t.Row("TIME", "EVENT", "FROM", "TO", "ACTOR", "REASON")
				for _, e := range items {
					from := ""
					if e.FromStatus != nil {
						from = string(*e.FromStatus)
					}
					t.Row(ts(e.CreatedAt), e.Event, from, string(e.ToStatus), string(e.ActorType), str(e.Reason))
				}
			})
		},
	}
}

func (a *app) allocReleaseCmd() *cobra.Command {
	var wait bool
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "release ALLOC",
		Short: "Release an allocation (its GPUs and billing stop)",
		Example: `  gantry alloc release train
  gantry alloc release train --wait`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			s, project, id, err := a.allocArg(ctx, args[0])
			if err != nil {
				return err
			}
			res, err := s.API.ReleaseAllocationWithResponse(ctx, id, &api.ReleaseAllocationParams{XProjectID: project})
			if err != nil {
				return err
			}
			if err := ok(res.HTTPResponse, res.Body); err != nil {
				var ae *apiclient.Error
				if !errors.As(err, &ae) || ae.Code != "allocation_already_releasing" {
					return err
				}
				// Releasing twice is not an error for the user: say where it stands.
				cur, gerr := s.API.GetAllocationWithResponse(ctx, id, &api.GetAllocationParams{XProjectID: project})
				if gerr != nil {
					return gerr
				}
				if gerr := ok(cur.HTTPResponse, cur.Body); gerr != nil {
					return gerr
				}
				fmt.Fprintf(a.errOut, "Allocation %s is already %s.\n", id, cur.JSON200.Status)
				res.JSON200 = cur.JSON200
			}
			alloc := res.JSON200
			if wait {
				if alloc, err = a.waitFor(ctx, s, project, alloc, timeout, releasedOrStuck); err != nil {
					return err
				}
			}
			return a.printer().Print(alloc, func(t *output.TableWriter) { allocPairs(t, alloc) })
		},
	}
	cmd.Flags().BoolVar(&wait, "wait", false, "wait until it is released")
	cmd.Flags().DurationVar(&timeout, "timeout", 15*time.Minute, "with --wait, stop waiting after this long")
	return cmd
}
