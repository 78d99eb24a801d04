//! The `spillway` binary as a user runs it: every process test of the CLI, one module per
//! command or concern, in one test binary (one link, not one per file).

mod support;

mod check;
mod check_warnings;
mod configure;
mod configure_builtin;
mod control;
mod criticality;
mod dashboard_browser;
mod demo;
mod deploy;
mod drain;
mod emulate;
mod failover;
mod grpc_bounds;
mod import;
mod kubernetes;
#[cfg(feature = "otlp")]
mod otlp;
mod proxy;
mod proxy_bounds;
mod proxy_upgrades_config;
mod readme_tls;
mod rlqs;
mod rlqs_crowd;
mod rls;
mod rls_python;
mod rls_standalone;
mod rules;
mod rules_unauthenticated;
mod security_headers;
mod sim;
mod tls;
mod tokens;
mod up;
mod wan;
