"""Optional integrations with other libraries; each module needs its own extra installed."""
