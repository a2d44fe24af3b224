"""Sending: the producer, the send pipeline (requests in flight per broker, with
retries) and what it keeps of a request, and back-pressure (busy answers, windows)."""
