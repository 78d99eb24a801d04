//! The private PostgreSQL server, driven with sqlx as the rules service will drive it.

use std::net::TcpStream;
use std::time::{Duration, Instant};

use spillway_testkit::{Error, Postgres, PostgresOptions};
use sqlx::{Connection, PgConnection, Row};

async fn connect(url: &str) -> PgConnection {
    PgConnection::connect(url)
        .await
        .expect("connect to the private PostgreSQL")
}

#[tokio::test]
async fn private_postgres_stores_and_reads_a_row() {
    let pg = Postgres::start().expect("start a private PostgreSQL");
    assert!(
        pg.url().ends_with(&format!(":{}/spillway", pg.port())),
        "{}",
        pg.url()
    );
    let mut con = connect(&pg.url()).await;

    let database: String = sqlx::query_scalar("SELECT current_database()")
        .fetch_one(&mut con)
        .await
        .unwrap();
    assert_eq!(database, "spillway");

    sqlx::query("CREATE TABLE rules (id INT PRIMARY KEY, api TEXT NOT NULL)")
        .execute(&mut con)
        .await
        .unwrap();
    sqlx::query("INSERT INTO rules (id, api) VALUES ($1, $2)")
        .bind(1)
        .bind("/search")
        .execute(&mut con)
        .await
        .unwrap();
    let row = sqlx::query("SELECT id, api FROM rules")
        .fetch_one(&mut con)
        .await
        .unwrap();
    assert_eq!(row.get::<i32, _>("id"), 1);
    assert_eq!(row.get::<String, _>("api"), "/search");
}

#[tokio::test]
async fn restarted_postgres_keeps_its_data_on_the_same_port() {
    let mut pg = Postgres::start().expect("start a private PostgreSQL");
    let port = pg.port();
    let mut con = connect(&pg.url()).await;
    sqlx::query("CREATE TABLE t (v TEXT)")
        .execute(&mut con)
        .await
        .unwrap();
    sqlx::query("INSERT INTO t VALUES ('committed before the stop')")
        .execute(&mut con)
        .await
        .unwrap();

    pg.stop();
    assert!(!pg.is_running());
    assert!(
        sqlx::query("SELECT 1").execute(&mut con).await.is_err(),
        "the old connection is cut"
    );
    assert!(
        PgConnection::connect(&pg.url()).await.is_err(),
        "nothing listens while stopped"
    );

    pg.restart().expect("restart on the same port");
    assert_eq!(pg.port(), port);
    let mut con = connect(&pg.url()).await;
    let v: String = sqlx::query_scalar("SELECT v FROM t")
        .fetch_one(&mut con)
        .await
        .unwrap();
    assert_eq!(v, "committed before the stop");
}

#[tokio::test]
async fn a_created_database_is_reachable_at_its_url() {
    let pg = Postgres::start_with(PostgresOptions::default().database("first"))
        .expect("start a private PostgreSQL");
    let url = pg.create_database("second").expect("create a database");
    let mut con = connect(&url).await;
    let database: String = sqlx::query_scalar("SELECT current_database()")
        .fetch_one(&mut con)
        .await
        .unwrap();
    assert_eq!(database, "second");
}

#[test]
fn dropping_postgres_stops_it_and_removes_its_folder() {
    let pg = Postgres::start().expect("start a private PostgreSQL");
    let addr = format!("127.0.0.1:{}", pg.port());
    let dir = pg.dir().to_path_buf();
    assert!(dir.join("data/PG_VERSION").is_file());
    assert!(
        pg.socket_dir()
            .join(format!(".s.PGSQL.{}", pg.port()))
            .exists()
    );
    drop(pg);
    assert!(
        TcpStream::connect(&addr).is_err(),
        "nothing listens after drop"
    );
    assert!(!dir.exists(), "{} is removed", dir.display());
}

#[test]
fn a_bogus_setting_fails_at_once_with_the_servers_complaint() {
    let started = Instant::now();
    let result = Postgres::start_with(PostgresOptions::default().setting("no_such_setting", "1"));
    let Err(err @ Error::Start { .. }) = result else {
        panic!("postgres accepted a bogus setting");
    };
    let message = err.to_string();
    assert!(message.contains("postgres on port"), "{message}");
    assert!(message.contains("exited"), "{message}");
    assert!(
        message.contains("unrecognized configuration parameter \"no_such_setting\""),
        "the log tail is included: {message}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "no wait for a timeout"
    );
}
