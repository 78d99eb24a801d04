//! Limits: `N/s`, `N/min`, `N/h`, `N/d` and `N per 30s`, parsed into a count over a period.
