"""Reading a queue range: the range reader and its settings, the pull engines (Python and the
C loop), the reads' per-broker backoff, and the driver's probe for SQL92 filtering."""
