"""Transactions: half messages, END_TRANSACTION, check-backs, and reading the op
topic for what reached the brokers."""
