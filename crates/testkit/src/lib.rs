//! Test support: private Redis, Sentinel and PostgreSQL instances on free loopback ports.
