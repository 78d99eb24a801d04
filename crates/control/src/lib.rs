//! Spillway's control plane: zone aggregators, regional controllers and the client side of the link.
#![forbid(unsafe_code)]
