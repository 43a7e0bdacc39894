package notifications

import (
	"encoding/json"
	"strings"

	"github.com/google/uuid"
)

// Domain events (published by the outbox relay under the events prefix) that become
// notifications. The payload is copied field by field from an allowlist, so a field a
// producer adds later (a node id, an amount) never reaches a browser by accident.
var (
	allocationFields = []string{"allocation_id", "project_id", "status", "from_status", "event", "sku"}
	budgetFields     = []string{
		"budget_id", "event_id", "project_id", "scope_type", "enforcement_mode", "threshold_key",
		"percent_used", "period_start", "period_end",
	}
	// budgetEvents are the budget event types that are pushed: a threshold crossed and a
	// suspension asked for (BillingBudgetEvent). Budget settings changes are not.
	budgetEvents = map[string]bool{"budget.threshold_crossed": true, "budget.suspend_requested": true}
	// invoiceEvents reach the tenant when an invoice is issued, paid or voided
	// (docs/invoices.md); drafts and write-offs are the platform's business.
	invoiceFields = []string{"invoice_id", "number", "status", "currency", "total_minor", "amount_due_minor", "period_start", "period_end"}
	invoiceEvents = map[string]bool{"invoice.issued": true, "invoice.paid": true, "invoice.voided": true}
)

// eventSubjects are the events-stream subjects (after the events prefix) a hub listens to.
var eventSubjects = []string{"allocation.>", "budget.>", "invoice.>"}

// fromEvent is the notification a domain event of type typ becomes, if any. Allocation
// status changes (allocation.<status>), budget events and invoice events go to their
// tenant's channel, limited to the project's members when they belong to a project.
func fromEvent(typ string, payload []byte) (Notification, bool) {
	var fields []string
	switch {
	case strings.HasPrefix(typ, "allocation."):
		fields = allocationFields
	case budgetEvents[typ]:
		fields = budgetFields
	case invoiceEvents[typ]:
		fields = invoiceFields
	default:
		return Notification{}, false
	}
	var p map[string]any
	if err := json.Unmarshal(payload, &p); err != nil {
		return Notification{}, false
	}
	tenant, ok := idField(p, "tenant_id")
	if !ok {
		return Notification{}, false
	}
	project, hasProject := idField(p, "project_id")
	if fields[0] == "allocation_id" {
		// Only status changes: the type names the status the allocation entered.
		status, _ := p["status"].(string)
		if !hasProject || "allocation."+status != typ {
			return Notification{}, false
		}
	}
	data := make(map[string]any, len(fields))
	for _, f := range fields {
		if v, ok := p[f]; ok {
			data[f] = v
		}
	}
	n := Notification{Channel: OrgChannel(tenant), Type: typ, Data: data}
	if hasProject {
		n.Project = project
	}
	return n, n.validate() == nil
}

func idField(p map[string]any, key string) (uuid.UUID, bool) {
	s, ok := p[key].(string)
	if !ok {
		return uuid.Nil, false
	}
	id, err := uuid.Parse(s)
	return id, err == nil && id != uuid.Nil
}
