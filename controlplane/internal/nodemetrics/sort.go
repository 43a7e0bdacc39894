package nodemetrics

import (
	"slices"
	"strings"

	dto "github.com/prometheus/client_model/go"
)

func sortStrings(s []string) { slices.Sort(s) }

func sortLabels(l []*dto.LabelPair) {
	slices.SortFunc(l, func(a, b *dto.LabelPair) int { return strings.Compare(a.GetName(), b.GetName()) })
}
