//! What the RLS and RLQS TLS tests share: a development CA and leaves issued from it.

use std::path::Path;
use std::sync::Arc;

use spillway_tls::certs::{self, Leaf, LeafRole};
use spillway_tls::{TlsFiles, TlsSource};

pub const TRUST: &str = "spillway.local";

/// A development CA in `dir` (made on first use) and a leaf of `role` in `region` and `zone`
/// for host `name`, issued into `dir/NAME`.
pub fn leaf(dir: &Path, name: &str, role: LeafRole, region: &str, zone: &str) -> Arc<TlsSource> {
    if !dir.join("ca/ca.pem").exists() {
        certs::init(&dir.join("ca"), TRUST, false).unwrap();
    }
    let request = Leaf {
        role,
        region: Some(region.into()),
        zone: Some(zone.into()),
        host: Some(name.into()),
        names: Vec::new(),
        days: 1,
    };
    let out = dir.join(name);
    certs::issue(&dir.join("ca"), TRUST, &request, &out, false).unwrap();
    let files = TlsFiles {
        cert: out.join("cert.pem"),
        key: out.join("key.pem"),
        ca: Some(out.join("ca.pem")),
    };
    TlsSource::load(files, TRUST).unwrap()
}
