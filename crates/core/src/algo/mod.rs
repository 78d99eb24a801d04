//! Limiter algorithms: each one decides a request of some cost against its own state.
