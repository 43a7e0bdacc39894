package allocations

import (
	"context"
	"fmt"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/billing"
)

// AccruedCosts is each allocation's accrued cost (billing.Accrued over its usage
// records: booked plus the running part not rated yet, in the currency it is billed
// in). Allocations that were never active have no usage and are absent, which the
// response shows as null. One read for a whole page.
func (s *Service) AccruedCosts(ctx context.Context, as []Allocation) (map[uuid.UUID]billing.Money, error) {
	ids := make([]uuid.UUID, 0, len(as))
	for _, a := range as {
		if a.ActiveAt != nil {
			ids = append(ids, a.ID)
		}
	}
	if len(ids) == 0 {
		return map[uuid.UUID]billing.Money{}, nil
	}
	m, err := s.Billing.Accrued(ctx, billing.SourceAllocation, ids, s.now())
	if err != nil {
		return nil, fmt.Errorf("accrued cost: %w", err)
	}
	return m, nil
}
