"""Reading a queue range: PULL_MESSAGE requests and answers, the pull engines (Python
and the C loop), the range reader, and the reads' per-broker backoff."""
