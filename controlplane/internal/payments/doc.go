// Package payments owns wallet top-ups taken through a payment provider (a Stripe-style
// API: PaymentIntents, Refunds, signed webhooks), the provider's webhook events, admin
// refunds and reconciliation with the provider. docs/payments.md is the operator's view.
//
// What it guarantees:
//   - A webhook is authenticated before anything is parsed or written: the body is read
//     under a cap and its Stripe-Signature (t=<unix>,v1=<hex HMAC-SHA256 of "t.body">,
//     several v1 values, several configured secrets, timestamps at most 300 s old and 30 s
//     ahead, hmac.Equal) verified; any failure is payment_signature_invalid (400), writes
//     nothing and counts in webhook_signature_failures_total.
//   - A verified event is stored once per (provider, provider event id); duplicates, even
//     concurrent ones, find the stored row, and the event row lock makes application
//     happen once.
//   - Payments move forward only, through one transition table (state.go); an event
//     asking for any other move is stored as ignored.
//   - Money moves only through the Wallet (the billing ledger), in the same transaction
//     as the payment's state change, its outbox event and its audit row. A captured
//     payment credits the wallet once (the ledger is also idempotent per payment id).
//   - A refund never exceeds captured minus refunded (row lock + a CHECK constraint),
//     never happens past the refund window, and never asks the provider for money the
//     wallet no longer holds.
//
// It never imports billing (the Wallet interface is the seam), never logs or publishes
// a client secret, API key or webhook secret, and never forwards provider text to a
// client.
package payments
