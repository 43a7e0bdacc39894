// Package accounts owns billing accounts (docs/billing-accounts.md): the tenant,
// reseller and end-customer accounts with every seed §2.2 field, their tax profile and
// invoice settings, the assignment of a pricing plan to a tenant, and the admin API over
// them. It tells the invoice builder who sells to whom under which tax profile
// (InvoiceAccount) and never lets a reseller act as its end customers' users: a reseller
// relationship is a payer/rating layer, not impersonation.
package accounts
