package command

import (
	"fmt"
	"sort"
	"strings"

	"github.com/spf13/cobra"

	"github.com/gantry-gpu/gantry/cli/internal/output"
	"github.com/gantry-gpu/gantry/proto/api"
)

func (a *app) skuCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "sku",
		Short:   "GPU machine types (SKUs): price per currency, free GPUs per region",
		Example: `  gantry sku list`,
	}
	cmd.AddCommand(&cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List the SKUs with their hourly price and free GPUs per region",
		Example: `  gantry sku list
  gantry sku list -o json | jq -r '.[].id'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, err := a.session()
			if err != nil {
				return err
			}
			items := []api.CatalogSKU{}
			var cursor *string
			for {
				res, err := s.API.ListCatalogSkusWithResponse(cmd.Context(), &api.ListCatalogSkusParams{Cursor: cursor})
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
				t.Row("SKU", "GPUS", "VCPU", "MEMORY", "PRICE/HOUR", "FREE GPUS")
				for _, k := range items {
					var prices, free []string
					for _, p := range k.Prices {
						prices = append(prices, money(p.HourlyRate))
					}
					sort.Strings(prices)
					for _, r := range k.Availability {
						free = append(free, fmt.Sprintf("%s=%d", r.RegionCode, r.FreeGpus))
					}
					t.Row(k.ID, fmt.Sprintf("%dx %s", k.GpuCount, k.GpuModel), fmt.Sprint(k.Vcpu), fmt.Sprintf("%d GiB", k.MemoryGib),
						strings.Join(prices, ", "), strings.Join(free, " "))
				}
			})
		},
	})
	return cmd
}
