//! Shared harness: a rules service on 127.0.0.1:0 over a real SQLite file or a private
//! PostgreSQL, with one user of each role, and more instances of it on the same store.
#![allow(dead_code)]

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use spillway_rules::client::{RulesClient, RulesResponse};
use spillway_rules::{Bounds, Budgets, Role, Store};
use spillway_testkit::Postgres;
use tempfile::TempDir;
use tokio::runtime::Runtime;

/// Where the store lives; dropping it removes the file or stops the server.
pub enum Db {
    Sqlite(TempDir),
    Postgres(Postgres),
}

impl Db {
    pub fn sqlite() -> Db {
        Db::Sqlite(tempfile::tempdir().expect("temporary folder"))
    }

    pub fn postgres() -> Db {
        Db::Postgres(Postgres::start().expect("private PostgreSQL"))
    }

    pub fn url(&self) -> String {
        match self {
            Db::Sqlite(dir) => format!("sqlite://{}", dir.path().join("rules.db").display()),
            Db::Postgres(pg) => pg.url(),
        }
    }
}

pub struct Service {
    pub runtime: Runtime,
    pub url: String,
    pub store: Store,
    pub admin: String,
    pub admin2: String,
    pub viewer: String,
    pub robot: String,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    // Dropped last: the server must stop before its database does.
    pub db: Db,
}

impl Drop for Service {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
}

pub fn start(db: Db) -> Service {
    start_with(db, Budgets::default())
}

pub fn start_with(db: Db, budgets: Budgets) -> Service {
    start_bounded(db, budgets, Bounds::default())
}

pub fn start_bounded(db: Db, budgets: Budgets, bounds: Bounds) -> Service {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let url = db.url();
    let (store, tokens, addr, tx) = runtime.block_on(async {
        let store = Store::connect_with(&url, budgets).await.expect("store");
        let mut tokens = Vec::new();
        for (name, role) in [
            ("alice", Role::Admin),
            ("bob", Role::Admin),
            ("victor", Role::Viewer),
            ("configurator", Role::Service),
        ] {
            tokens.push(store.create_user(name, role).await.expect("user").1);
        }
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(spillway_rules::serve_with(
            listener,
            store.clone(),
            bounds,
            async {
                let _ = rx.await;
            },
        ));
        (store, tokens, addr, tx)
    });
    Service {
        runtime,
        url: format!("http://{addr}"),
        store,
        admin: tokens[0].clone(),
        admin2: tokens[1].clone(),
        viewer: tokens[2].clone(),
        robot: tokens[3].clone(),
        shutdown: Some(tx),
        db,
    }
}

/// Another instance of the service on the same store, as a second replica behind a load
/// balancer would be: its own pool, its own memory of verified tokens.
pub struct Instance {
    pub url: String,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Instance {
    pub fn client(&self, token: &str) -> RulesClient {
        RulesClient::new(&self.url, Some(token.to_owned()))
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
}

impl Service {
    /// A second instance of the service on this one's store.
    pub fn another_instance(&self) -> Instance {
        let url = self.db.url();
        let (addr, tx) = self.runtime.block_on(async {
            let store = Store::connect(&url).await.expect("store");
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind");
            let addr = listener.local_addr().unwrap();
            let (tx, rx) = tokio::sync::oneshot::channel::<()>();
            tokio::spawn(spillway_rules::serve(listener, store, async {
                let _ = rx.await;
            }));
            (addr, tx)
        });
        Instance {
            url: format!("http://{addr}"),
            shutdown: Some(tx),
        }
    }

    pub fn client(&self, token: &str) -> RulesClient {
        RulesClient::new(&self.url, Some(token.to_owned()))
    }

    pub fn anonymous(&self) -> RulesClient {
        RulesClient::new(&self.url, None)
    }

    pub fn rules(&self) -> Vec<Value> {
        let answer = self.client(&self.admin).get("/v1/rules").unwrap();
        assert_eq!(answer.status, 200);
        answer.body.as_array().unwrap().clone()
    }

    pub fn audit(&self) -> Vec<Value> {
        let answer = self.client(&self.admin).get("/v1/audit").unwrap();
        assert_eq!(answer.status, 200);
        answer.body.as_array().unwrap().clone()
    }

    pub fn version(&self) -> i64 {
        self.runtime.block_on(self.store.version()).unwrap()
    }

    pub fn create(&self, token: &str, rule: &Value) -> RulesResponse {
        self.client(token)
            .post("/v1/rules", &rule.to_string())
            .unwrap()
    }
}

/// A valid rule whose name and caller are `n`-th of their kind.
pub fn rule(n: usize) -> Value {
    json!({
        "service": "api",
        "name": format!("gw-{n}"),
        "match": { "caller": format!("gw-{n}"), "procedure": "/a" },
        "limit": "100/s",
        "algorithm": "token-bucket",
    })
}

/// Polls `check` until it returns `Some`, for at most `limit`.
pub fn eventually<T>(limit: Duration, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(value) = check() {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "condition not met within {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Runs a test body once on SQLite and once on PostgreSQL.
#[macro_export]
macro_rules! on_both {
    ($($name:ident),* $(,)?) => {
        $(
            mod $name {
                #[test]
                fn sqlite() {
                    super::$name($crate::common::Db::sqlite());
                }
                #[test]
                fn postgres() {
                    super::$name($crate::common::Db::postgres());
                }
            }
        )*
    };
}
