package command

import (
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/spf13/cobra"

	"github.com/gantry-gpu/gantry/cli/internal/output"
	"github.com/gantry-gpu/gantry/proto/api"
)

func (a *app) balanceCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "balance",
		Short: "Show the tenant's prepaid balance (per currency)",
		Example: `  gantry balance
  gantry balance -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, err := a.session()
			if err != nil {
				return err
			}
			res, err := s.API.GetBillingBalanceWithResponse(cmd.Context(), &api.GetBillingBalanceParams{})
			if err != nil {
				return err
			}
			if err := ok(res.HTTPResponse, res.Body); err != nil {
				return err
			}
			b := res.JSON200
			return a.printer().Print(b, func(t *output.TableWriter) {
				t.Row("CURRENCY", "BALANCE")
				for _, m := range b.Balances {
					t.Row(m.Currency, money(m))
				}
				if len(b.Balances) == 0 {
					t.Row(b.Balance.Currency, money(b.Balance))
				}
			})
		},
	}
}

func (a *app) usageCmd() *cobra.Command {
	var from, to string
	cmd := &cobra.Command{
		Use:   "usage",
		Short: "List rated usage lines (what was billed, per period)",
		Example: `  gantry usage
  gantry usage --from 2026-11-01T00:00:00Z --to 2026-12-01T00:00:00Z -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, err := a.session()
			if err != nil {
				return err
			}
			params := api.ListBillingUsageParams{}
			for _, p := range []struct {
				v   string
				dst **time.Time
			}{{from, &params.From}, {to, &params.To}} {
				if p.v == "" {
					continue
				}
				t, err := time.Parse(time.RFC3339, p.v)
				if err != nil {
					return usageErr(fmt.Errorf("--from/--to take RFC 3339 times: %w", err))
				}
				*p.dst = &t
			}
			items := []api.BillingRatedUsageLine{}
			for {
				res, err := s.API.ListBillingUsageWithResponse(cmd.Context(), &params)
				if err != nil {
					return err
				}
				if err := ok(res.HTTPResponse, res.Body); err != nil {
					return err
				}
				items = append(items, res.JSON200.Items...)
				if params.Cursor = res.JSON200.Pagination.NextCursor; params.Cursor == nil {
					break
				}
			}
			return a.printer().Print(items, func(t *output.TableWriter) {
				t.Row("FROM", "TO", "UNIT", "QUANTITY", "UNIT PRICE", "AMOUNT", "SOURCE")
				for _, u := range items {
					t.Row(ts(u.BillFrom), ts(u.BillTo), u.UsageUnit, fmt.Sprintf("%d.%03d", u.UnitQuantityMillis/1000, u.UnitQuantityMillis%1000),
						money(u.UnitPrice), money(u.Amount), string(u.UsageSource))
				}
			})
		},
	}
	cmd.Flags().StringVar(&from, "from", "", "period start (RFC 3339)")
	cmd.Flags().StringVar(&to, "to", "", "period end (RFC 3339)")
	return cmd
}

func (a *app) budgetCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "budget",
		Short: "List and create spending budgets",
		Example: `  gantry budget list
  gantry budget create --amount 500.00 --currency USD --period monthly --scope project`,
	}
	cmd.AddCommand(&cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List budgets with their latest event",
		Example: `  gantry budget list
  gantry budget list -o yaml`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, err := a.session()
			if err != nil {
				return err
			}
			res, err := s.API.ListBillingBudgetsWithResponse(cmd.Context(), &api.ListBillingBudgetsParams{})
			if err != nil {
				return err
			}
			if err := ok(res.HTTPResponse, res.Body); err != nil {
				return err
			}
			items := append([]api.BillingBudgetPosture{}, res.JSON200.Items...)
			return a.printer().Print(items, func(t *output.TableWriter) { budgetTable(t, items) })
		},
	}, a.budgetCreateCmd())
	return cmd
}

func budgetTable(t *output.TableWriter, items []api.BillingBudgetPosture) {
	t.Row("ID", "NAME", "SCOPE", "PERIOD", "AMOUNT", "THRESHOLD", "MODE", "ACTIVE")
	for _, b := range items {
		t.Row(b.ID.String(), b.Name, string(b.ScopeType), string(b.Period), money(b.Amount), fmt.Sprintf("%d%%", b.ThresholdPercent),
			string(b.EnforcementMode), yesNo(b.Active))
	}
}

func (a *app) budgetCreateCmd() *cobra.Command {
	var name, amount, currency, period, scope, mode string
	var threshold int
	cmd := &cobra.Command{
		Use:   "create --amount AMOUNT --currency CUR",
		Short: "Create a budget for the tenant or the project",
		Example: `  gantry budget create --amount 500.00 --currency USD --period monthly --scope project
  gantry budget create --name q4 --amount 20000 --currency EUR --period quarterly --scope tenant --mode block_launch --threshold 80`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := required(cmd, "amount"); err != nil {
				return err
			}
			s, err := a.session()
			if err != nil {
				return err
			}
			minor, err := parseMinor(amount, currency)
			if err != nil {
				return usageErr(err)
			}
			body := api.CreateBillingBudgetJSONRequestBody{
				Amount: api.Money{AmountMinor: minor, Currency: currency}, Period: api.BillingBudgetCreateRequestPeriod(period),
				ScopeType: api.BillingBudgetScopeType(scope),
			}
			if name != "" {
				body.Name = &name
			}
			if mode != "" {
				m := api.BillingBudgetEnforcementMode(mode)
				body.EnforcementMode = &m
			}
			if cmd.Flags().Changed("threshold") {
				body.ThresholdPercent = &threshold
			}
			if scope == string(api.BillingBudgetScopeTypeProject) {
				project, err := a.project(cmd.Context(), s)
				if err != nil {
					return err
				}
				body.ProjectID = &project
			}
			idem := uuid.NewString()
			res, err := s.API.CreateBillingBudgetWithResponse(cmd.Context(), &api.CreateBillingBudgetParams{IdempotencyKey: &idem}, body)
			if err != nil {
				return err
			}
			if err := ok(res.HTTPResponse, res.Body); err != nil {
				return err
			}
			return a.printer().Print(res.JSON201, func(t *output.TableWriter) { budgetTable(t, []api.BillingBudgetPosture{*res.JSON201}) })
		},
	}
	f := cmd.Flags()
	f.StringVar(&name, "name", "", "budget name")
	f.StringVar(&amount, "amount", "", "amount in the currency's units, e.g. 500.00")
	f.StringVar(&currency, "currency", "USD", "ISO 4217 currency")
	f.StringVar(&period, "period", "monthly", "monthly, quarterly, annual or custom")
	f.StringVar(&scope, "scope", "project", "project (the command's project) or tenant")
	f.StringVar(&mode, "mode", "", "enforcement: notify_only, block_launch or suspend (default: the API's)")
	f.IntVar(&threshold, "threshold", 0, "alert threshold in percent (default: the API's)")
	return cmd
}

// parseMinor turns "500.00" into minor units exactly, refusing more decimals than the
// currency has.
func parseMinor(s, currency string) (int64, error) {
	d, known := minorDigits[currency]
	if !known {
		d = 2
	}
	var whole, frac string
	whole = s
	for i, c := range s {
		if c == '.' {
			whole, frac = s[:i], s[i+1:]
			break
		}
	}
	if whole == "" && frac == "" {
		return 0, fmt.Errorf("amount %q is not a number", s)
	}
	if len(frac) > d {
		return 0, fmt.Errorf("%s has %d decimals at most: %q", currency, d, s)
	}
	for len(frac) < d {
		frac += "0"
	}
	var v int64
	for _, c := range whole + frac {
		if c < '0' || c > '9' {
			return 0, fmt.Errorf("amount %q is not a positive decimal number", s)
		}
		v = v*10 + int64(c-'0')
		if v > 1<<53 {
			return 0, fmt.Errorf("amount %q is too large", s)
		}
	}
	return v, nil
}
