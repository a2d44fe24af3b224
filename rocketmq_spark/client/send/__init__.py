"""Sending: the producer, the send pipeline (requests in flight per broker, with retries)
and what it keeps of a request, and how a sender yields to a busy broker (windows, budgets)."""
