// Package invoices owns invoices (docs/invoices.md): the period close that builds a draft
// from a tenant's rated usage, adjustments and credits in one currency, the tax lines of
// the account's treatment, issuing with a gapless number per seller, payments, void and
// write-off through one transition table, the tenant and admin API and the PDF.
//
// It never changes rated usage or ledger entries (they are immutable): it claims them
// for an invoice, and the only posting it makes is the exact wallet re-credit of a voided
// prepaid invoice. An invoice that left draft is never changed again except its status
// and payment figures (the database refuses it too).
package invoices
