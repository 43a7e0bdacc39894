package command

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/google/uuid"
	"github.com/spf13/cobra"

	"github.com/gantry-gpu/gantry/cli/internal/output"
	"github.com/gantry-gpu/gantry/proto/api"
)

// The invoice commands: the tenant's invoices (docs/invoices.md), read-only; issuing,
// voiding and writing off are the platform's (admin API).
func (a *app) invoiceCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "invoice",
		Aliases: []string{"invoices"},
		Short:   "List your tenant's invoices, show one with its lines, download its PDF",
		Example: `  gantry invoice list
  gantry invoice list --status due -o json
  gantry invoice get 0193a0c4-7f2e-7c1d-8e4b-5a6f7d8e9f00
  gantry invoice pdf 0193a0c4-7f2e-7c1d-8e4b-5a6f7d8e9f00 --out invoice.pdf`,
	}
	cmd.AddCommand(a.invoiceListCmd(), a.invoiceGetCmd(), a.invoicePDFCmd())
	return cmd
}

func (a *app) invoiceListCmd() *cobra.Command {
	var status, from, to string
	cmd := &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List the tenant's invoices (newest first), optionally by status and period",
		Example: `  gantry invoice list
  gantry invoice list --status paid --from 2026-01-01T00:00:00Z -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, err := a.session()
			if err != nil {
				return err
			}
			params := api.ListBillingInvoicesParams{}
			if status != "" {
				st := api.BillingInvoiceStatus(status)
				params.Status = &st
			}
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
			items := []api.BillingInvoiceSummary{}
			for {
				res, err := s.API.ListBillingInvoicesWithResponse(cmd.Context(), &params)
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
				t.Row("ID", "NUMBER", "PERIOD", "STATUS", "TOTAL", "TAX", "DUE")
				for _, in := range items {
					t.Row(in.ID.String(), str(in.InvoiceNumber), period(in.PeriodStart, in.PeriodEnd), string(in.Status),
						money(in.Total), money(in.TaxTotal), tsPtr(in.DueAt))
				}
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&status, "status", "", "only invoices in this state (draft is never shown to tenants): issued, due, partially_paid, paid, void, written_off")
	f.StringVar(&from, "from", "", "periods starting at or after this time (RFC 3339)")
	f.StringVar(&to, "to", "", "periods ending at or before this time (RFC 3339)")
	return cmd
}

func period(from, to time.Time) string {
	return from.UTC().Format("2006-01-02") + ".." + to.UTC().Format("2006-01-02")
}

func invoiceArg(ref string) (uuid.UUID, error) {
	id, err := uuid.Parse(ref)
	if err != nil {
		return uuid.Nil, usageErr(fmt.Errorf("INVOICE is an invoice id (gantry invoice list): %w", err))
	}
	return id, nil
}

func (a *app) invoiceGetCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "get INVOICE",
		Short: "Show one invoice with its lines and tax breakdown",
		Example: `  gantry invoice get 0193a0c4-7f2e-7c1d-8e4b-5a6f7d8e9f00
  gantry invoice get 0193a0c4-7f2e-7c1d-8e4b-5a6f7d8e9f00 -o yaml`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := invoiceArg(args[0])
			if err != nil {
				return err
			}
			s, err := a.session()
			if err != nil {
				return err
			}
			res, err := s.API.GetBillingInvoiceWithResponse(cmd.Context(), id, &api.GetBillingInvoiceParams{})
			if err != nil {
				return err
			}
			if err := ok(res.HTTPResponse, res.Body); err != nil {
				return err
			}
			in := res.JSON200
			return a.printer().Print(in, func(t *output.TableWriter) {
				t.Pairs("ID", in.ID.String(), "Number", str(in.InvoiceNumber), "Period", period(in.PeriodStart, in.PeriodEnd),
					"Status", string(in.Status), "Total", money(in.Total), "Tax", money(in.TaxTotal),
					"Tax treatment", string(in.TaxTreatment), "Jurisdiction", str(in.TaxJurisdiction),
					"Issued", tsPtr(in.IssuedAt), "Due", tsPtr(in.DueAt))
				t.Row("")
				t.Row("LINE", "DESCRIPTION", "AMOUNT", "TAX CATEGORY", "RATE (BPS)")
				for _, l := range in.Lines {
					t.Row(string(l.LineType), l.Description, money(l.Amount), str(l.TaxCategory), intPtr(l.TaxRateBps))
				}
			})
		},
	}
}

func intPtr(p *int) string {
	if p == nil {
		return ""
	}
	return fmt.Sprint(*p)
}

func (a *app) invoicePDFCmd() *cobra.Command {
	var out string
	cmd := &cobra.Command{
		Use:   "pdf INVOICE --out FILE",
		Short: "Download an invoice as PDF (--out - writes to stdout)",
		Example: `  gantry invoice pdf 0193a0c4-7f2e-7c1d-8e4b-5a6f7d8e9f00 --out invoice.pdf
  gantry invoice pdf 0193a0c4-7f2e-7c1d-8e4b-5a6f7d8e9f00 --out - | pdftotext - -`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := required(cmd, "out"); err != nil {
				return err
			}
			id, err := invoiceArg(args[0])
			if err != nil {
				return err
			}
			s, err := a.session()
			if err != nil {
				return err
			}
			accept := func(_ context.Context, r *http.Request) error { r.Header.Set("Accept", "application/pdf"); return nil }
			res, err := s.API.ClientInterface.GetBillingInvoice(cmd.Context(), id, &api.GetBillingInvoiceParams{}, accept)
			if err != nil {
				return err
			}
			defer res.Body.Close()
			if res.StatusCode != http.StatusOK {
				body, _ := io.ReadAll(io.LimitReader(res.Body, 1<<20))
				if err := ok(res, body); err != nil {
					return err
				}
				return fmt.Errorf("unexpected answer %d", res.StatusCode)
			}
			if ct := res.Header.Get("Content-Type"); ct != "application/pdf" {
				return fmt.Errorf("the control plane answered %q, not a PDF", ct)
			}
			var w io.Writer = a.out
			if out != "-" {
				// Written beside the target and renamed, so a failed download leaves no
				// half file under the name asked for.
				f, err := os.CreateTemp(filepath.Dir(out), ".invoice-*.pdf")
				if err != nil {
					return err
				}
				defer os.Remove(f.Name())
				if _, err := io.Copy(f, res.Body); err != nil {
					f.Close()
					return err
				}
				if err := f.Close(); err != nil {
					return err
				}
				if err := os.Rename(f.Name(), out); err != nil {
					return err
				}
				fmt.Fprintf(a.errOut, "Saved %s\n", out)
				return nil
			}
			_, err = io.Copy(w, res.Body)
			return err
		},
	}
	cmd.Flags().StringVar(&out, "out", "", "file to write (- for stdout)")
	return cmd
}
