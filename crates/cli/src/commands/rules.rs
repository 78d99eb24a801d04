//! `spillway rules ...`: the rules service and its admin client. Wiring only: the
//! work is in `spillway-rules`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use serde_json::{Value, json};
use spillway_core::limit::format_duration;
use spillway_rules::client::{CallError, RulesClient, RulesResponse, plaintext_off_loopback};
use spillway_rules::{AccessError, Bounds, Budgets, Role, ServerTls, Store, StoreError};

use crate::args::{AdminCommand, RulesClientArgs, RulesCommand, TokenCommand, UserCommand};

pub fn rules(command: RulesCommand) -> ExitCode {
    match command {
        RulesCommand::Serve {
            listen,
            database,
            tls_cert,
            tls_key,
            insecure_plaintext,
            admin_budget,
            service_budget,
            max_override_ttl,
            drain_timeout,
        } => serve(
            listen,
            &database,
            tls_cert.zip(tls_key),
            insecure_plaintext,
            Budgets {
                admin: admin_budget,
                service: service_budget,
            },
            Bounds { max_override_ttl },
            drain_timeout,
        ),
        RulesCommand::Apply {
            client,
            file,
            dry_run,
        } => with_client(&client, |c| apply(c, &file, dry_run)),
        RulesCommand::List { client, service } => {
            with_client(&client, |c| list(c, service.as_deref()))
        }
        RulesCommand::Get { client, id } => with_client(&client, |c| get(c, &id)),
        RulesCommand::Delete { client, id } => with_client(&client, |c| delete(c, &id)),
        RulesCommand::History {
            client,
            limit,
            before,
        } => with_client(&client, |c| history(c, limit, before)),
        RulesCommand::Admin {
            command:
                AdminCommand::Create {
                    name,
                    role,
                    database,
                    expires,
                },
        } => admin_create(&name, role, &database, expires),
        RulesCommand::User { command } => user(command),
        RulesCommand::Token { command } => token(command),
    }
}

fn runtime() -> Result<tokio::runtime::Runtime, ExitCode> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|err| {
            eprintln!("spillway rules: cannot start the async runtime: {err}");
            ExitCode::from(1)
        })
}

/// A bad URL is bad usage (2); a database that does not answer is a runtime failure (1).
fn store_failure(err: &StoreError) -> ExitCode {
    eprintln!("spillway rules: {err}");
    ExitCode::from(if matches!(err, StoreError::Url(_)) {
        2
    } else {
        1
    })
}

/// Bearer tokens never cross a network in plaintext unless asked to. Without TLS the
/// address must be loopback, or `--insecure-plaintext` given (then a warning at every start).
fn serve(
    listen: SocketAddr,
    database: &str,
    tls: Option<(PathBuf, PathBuf)>,
    insecure_plaintext: bool,
    budgets: Budgets,
    bounds: Bounds,
    drain_timeout: Duration,
) -> ExitCode {
    let tls = match tls {
        Some((cert, key)) => match ServerTls::load(cert, key) {
            Ok(tls) => Some(tls),
            Err(err) => {
                eprintln!("spillway rules serve: {err}");
                return ExitCode::from(2);
            }
        },
        None => None,
    };
    let loopback = listen.ip().to_canonical().is_loopback();
    if tls.is_none() && !loopback {
        if !insecure_plaintext {
            eprintln!(
                "spillway rules serve: --listen {listen} is not a loopback address, and without \
                 TLS bearer tokens would cross the network in plaintext: give --tls-cert FILE \
                 --tls-key FILE, or listen on 127.0.0.1, or pass --insecure-plaintext to accept \
                 the risk"
            );
            return ExitCode::from(2);
        }
        tracing::warn!(
            %listen,
            "--insecure-plaintext: serving plaintext http off loopback; bearer tokens cross the \
             network in plaintext, readable by anyone on the path"
        );
    }
    let runtime = match runtime() {
        Ok(runtime) => runtime,
        Err(code) => return code,
    };
    runtime.block_on(async {
        let store = match Store::connect_with(database, budgets).await {
            Ok(store) => store,
            Err(err) => return store_failure(&err),
        };
        let (stopping, stopped) = tokio::sync::oneshot::channel();
        let shutdown = async move {
            super::stop_signal().await;
            tracing::info!("stopping: finishing the requests in flight");
            let _ = stopping.send(());
        };
        let serving = spillway_rules::bind_and_serve(listen, store.clone(), bounds, tls, shutdown);
        // The drain: requests in flight get --drain-timeout, then their connections close.
        let deadline = async move {
            if stopped.await.is_ok() {
                tokio::time::sleep(drain_timeout).await;
            } else {
                std::future::pending::<()>().await;
            }
        };
        let served = tokio::select! {
            served = serving => served,
            () = deadline => {
                tracing::warn!(?drain_timeout, "drain timeout passed; closing the connections still open");
                Ok(())
            }
        };
        match served {
            Ok(()) => {
                store.close().await;
                ExitCode::SUCCESS
            }
            Err(err) => {
                eprintln!("spillway rules serve: {listen}: {err}");
                ExitCode::from(1)
            }
        }
    })
}

fn admin_create(name: &str, role: Role, database: &str, expires: Option<Duration>) -> ExitCode {
    let runtime = match runtime() {
        Ok(runtime) => runtime,
        Err(code) => return code,
    };
    runtime.block_on(async {
        let store = match Store::connect(database).await {
            Ok(store) => store,
            Err(err) => return store_failure(&err),
        };
        let created = store.create_user_with(name, role, expires).await;
        store.close().await;
        match created {
            Ok((user, info, token)) => {
                let until = info
                    .expires_at
                    .map_or(String::new(), |at| format!(", until {}", format_at(at)));
                eprintln!(
                    "created {} {} (id {}, token {}{until}); its token is shown once, here:",
                    user.role, user.name, user.id, info.id
                );
                println!("{token}");
                ExitCode::SUCCESS
            }
            Err(err @ AccessError::Conflict(_)) => {
                eprintln!("spillway rules admin create: {err}");
                ExitCode::from(2)
            }
            Err(err) => {
                eprintln!("spillway rules admin create: {err}");
                ExitCode::from(1)
            }
        }
    })
}

/// Runs `command` with a client of `args`' server: a CA file that cannot be used, or one given
/// for an `http://` server (never a silent downgrade), is bad usage (2).
fn with_client(args: &RulesClientArgs, command: impl FnOnce(&RulesClient) -> ExitCode) -> ExitCode {
    let client = match &args.ca {
        Some(ca) => match RulesClient::with_ca(&args.server, args.token.clone(), ca) {
            Ok(client) => client,
            Err(err) => {
                eprintln!("spillway rules: --ca: {err}");
                return ExitCode::from(2);
            }
        },
        None => RulesClient::new(&args.server, args.token.clone()),
    };
    if plaintext_off_loopback(&args.server) && args.token.is_some() {
        eprintln!(
            "spillway rules: warning: {} is plaintext http off loopback: the bearer token \
             crosses the network readable by anyone on the path; use https://",
            args.server
        );
    }
    command(&client)
}

/// Prints a failed call: an invalid rule or file is bad configuration (2), the rest runtime (1).
fn failed(command: &str, err: &CallError) -> ExitCode {
    eprintln!("spillway rules {command}: {err}");
    match err {
        CallError::Status { status: 422, .. } | CallError::Status { status: 400, .. } => {
            ExitCode::from(2)
        }
        _ => ExitCode::from(1),
    }
}

fn call(command: &str, answer: Result<RulesResponse, CallError>) -> Result<Value, ExitCode> {
    answer
        .and_then(RulesResponse::ok)
        .map(|a| a.body)
        .map_err(|err| failed(command, &err))
}

fn text(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Null => "-".to_owned(),
        other => other.to_string(),
    }
}

fn describe(rule: &Value) -> String {
    let matching =
        rule["match"]
            .as_object()
            .filter(|m| !m.is_empty())
            .map_or("everything".to_owned(), |m| {
                m.iter()
                    .map(|(k, v)| format!("{k}={}", text(v)))
                    .collect::<Vec<_>>()
                    .join(",")
            });
    format!(
        "{}/{}  {}  {}  {}",
        text(&rule["service"]),
        text(&rule["name"]),
        matching,
        text(&rule["limit"]),
        text(&rule["algorithm"]),
    )
}

/// The keys whose value differs between two versions of a rule, as `key: old -> new`.
fn changes(before: &Value, after: &Value) -> Vec<String> {
    let (Some(before), Some(after)) = (before.as_object(), after.as_object()) else {
        return Vec::new();
    };
    let owned = [
        "id",
        "version",
        "created_by",
        "created_at",
        "updated_at",
        "service",
    ];
    let mut keys: Vec<&String> = before.keys().chain(after.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .filter(|k| !owned.contains(&k.as_str()) && before.get(*k) != after.get(*k))
        .map(|k| {
            format!(
                "{k}: {} -> {}",
                before.get(k).map_or("-".to_owned(), text),
                after.get(k).map_or("-".to_owned(), text)
            )
        })
        .collect()
}

fn print_diff(diff: &Value) {
    let list = |key: &str| diff[key].as_array().cloned().unwrap_or_default();
    for rule in list("created") {
        println!("+ {}", describe(&rule));
    }
    for pair in list("updated") {
        println!("~ {}", describe(&pair["after"]));
        for change in changes(&pair["before"], &pair["after"]) {
            println!("    {change}");
        }
    }
    for rule in list("deleted") {
        println!("- {}", describe(&rule));
    }
    println!(
        "{} to create, {} to update, {} to delete, {} unchanged",
        list("created").len(),
        list("updated").len(),
        list("deleted").len(),
        text(&diff["unchanged"])
    );
}

fn apply(client: &RulesClient, file: &Path, dry_run: bool) -> ExitCode {
    let body = match std::fs::read_to_string(file) {
        Ok(body) => body,
        Err(err) => {
            eprintln!("{}: cannot read the file: {err}", file.display());
            return ExitCode::from(2);
        }
    };
    let plan = match call("apply", client.post("/v1/rules:apply?dry_run=true", &body)) {
        Ok(plan) => plan,
        Err(code) => return code,
    };
    print_diff(&plan);
    let nothing = ["created", "updated", "deleted"]
        .iter()
        .all(|k| plan[k].as_array().is_none_or(Vec::is_empty));
    if dry_run {
        println!(
            "dry run: nothing changed (rules version {})",
            plan["version"]
        );
        return ExitCode::SUCCESS;
    }
    if nothing {
        println!("nothing to apply (rules version {})", plan["version"]);
        return ExitCode::SUCCESS;
    }
    match call("apply", client.post("/v1/rules:apply", &body)) {
        Ok(done) => {
            println!("applied: rules version {}", done["version"]);
            ExitCode::SUCCESS
        }
        Err(code) => code,
    }
}

fn list(client: &RulesClient, service: Option<&str>) -> ExitCode {
    let path = match service {
        Some(service) => format!("/v1/rules?service={}", encode(service)),
        None => "/v1/rules".to_owned(),
    };
    match call("list", client.get(&path)) {
        Ok(rules) => {
            for rule in rules.as_array().into_iter().flatten() {
                let expires = rule["expires_at"]
                    .as_str()
                    .map_or(String::new(), |at| format!("  until {at}"));
                println!(
                    "{}  v{}  {}{expires}",
                    text(&rule["id"]),
                    text(&rule["version"]),
                    describe(rule)
                );
            }
            ExitCode::SUCCESS
        }
        Err(code) => code,
    }
}

fn get(client: &RulesClient, id: &str) -> ExitCode {
    match call("get", client.get(&format!("/v1/rules/{}", encode(id)))) {
        Ok(rule) => {
            println!(
                "{}",
                serde_json::to_string_pretty(&rule).unwrap_or_default()
            );
            ExitCode::SUCCESS
        }
        Err(code) => code,
    }
}

fn delete(client: &RulesClient, id: &str) -> ExitCode {
    let answer = client.send("DELETE", &format!("/v1/rules/{}", encode(id)), None, None);
    match call("delete", answer) {
        Ok(_) => {
            println!("deleted {id}");
            ExitCode::SUCCESS
        }
        Err(code) => code,
    }
}

fn format_at(millis: i64) -> String {
    spillway_rules::time::format_millis(millis)
}

fn history(client: &RulesClient, limit: u32, before: Option<i64>) -> ExitCode {
    let mut path = format!("/v1/audit?limit={limit}");
    if let Some(before) = before {
        path.push_str(&format!("&before={before}"));
    }
    let answer = client.get(&path);
    let more = answer.as_ref().is_ok_and(|a| a.link.is_some());
    match call("history", answer) {
        Ok(entries) => {
            for entry in entries.as_array().into_iter().flatten() {
                let subject = if entry["after"].is_object() {
                    describe(&entry["after"])
                } else if entry["before"].is_object() {
                    describe(&entry["before"])
                } else {
                    format!(
                        "{} rules in, {} out",
                        entry["after"].as_array().map_or(0, Vec::len),
                        entry["before"].as_array().map_or(0, Vec::len)
                    )
                };
                let reason = entry["reason"]
                    .as_str()
                    .map_or(String::new(), |r| format!("  ({r})"));
                println!(
                    "v{} <- v{}  {}  {}  {}  {subject}{reason}",
                    text(&entry["version"]),
                    text(&entry["from_version"]),
                    text(&entry["at"]),
                    text(&entry["actor"]),
                    text(&entry["action"]),
                );
            }
            if more && let Some(last) = entries.as_array().and_then(|e| e.last()) {
                eprintln!(
                    "older entries: spillway rules history --limit {limit} --before {}",
                    text(&last["version"])
                );
            }
            ExitCode::SUCCESS
        }
        Err(code) => code,
    }
}

fn user(command: UserCommand) -> ExitCode {
    match command {
        UserCommand::List { client: args } => with_client(&args, |client| {
            match call("user list", client.get("/v1/users")) {
                Ok(users) => {
                    for user in users.as_array().into_iter().flatten() {
                        println!(
                            "{}  {}  {} active token(s)  since {}  id {}",
                            text(&user["name"]),
                            text(&user["role"]),
                            text(&user["active_tokens"]),
                            text(&user["created_at"]),
                            text(&user["id"]),
                        );
                    }
                    ExitCode::SUCCESS
                }
                Err(code) => code,
            }
        }),
        UserCommand::Create {
            client: args,
            name,
            role,
            expires,
        } => {
            let mut body = json!({"name": name, "role": role.name()});
            if let Some(expires) = expires {
                body["expires"] = json!(format_duration(expires));
            }
            with_client(&args, |client| {
                match call("user create", client.post("/v1/users", &body.to_string())) {
                    Ok(made) => {
                        eprintln!(
                            "created {} {}; {}",
                            text(&made["user"]["role"]),
                            text(&made["user"]["name"]),
                            token_shown(&made["token"])
                        );
                        println!("{}", text(&made["token"]["token"]));
                        ExitCode::SUCCESS
                    }
                    Err(code) => code,
                }
            })
        }
        UserCommand::Update {
            client: args,
            name,
            role,
        } => {
            let body = json!({"role": role.name()}).to_string();
            let path = format!("/v1/users/{}", encode(&name));
            with_client(&args, |client| {
                match call(
                    "user update",
                    client.send("PATCH", &path, Some(&body), None),
                ) {
                    Ok(user) => {
                        println!("{} is now {}", text(&user["name"]), text(&user["role"]));
                        ExitCode::SUCCESS
                    }
                    Err(code) => code,
                }
            })
        }
        UserCommand::Delete { client: args, name } => {
            let path = format!("/v1/users/{}", encode(&name));
            with_client(&args, |client| {
                match call("user delete", client.send("DELETE", &path, None, None)) {
                    Ok(_) => {
                        println!("deleted {name} and its tokens");
                        ExitCode::SUCCESS
                    }
                    Err(code) => code,
                }
            })
        }
    }
}

/// What stderr says of a token just shown on stdout.
fn token_shown(token: &Value) -> String {
    let until = match &token["expires_at"] {
        Value::String(at) => format!("expires {at}"),
        _ => "does not expire".to_owned(),
    };
    format!(
        "token {} ({until}) is shown once, here:",
        text(&token["id"])
    )
}

fn token(command: TokenCommand) -> ExitCode {
    match command {
        TokenCommand::Create {
            client: args,
            user,
            expires,
        } => {
            let mut body = json!({});
            if let Some(user) = user {
                body["user"] = json!(user);
            }
            if let Some(expires) = expires {
                body["expires"] = json!(format_duration(expires));
            }
            with_client(&args, |client| {
                match call("token create", client.post("/v1/tokens", &body.to_string())) {
                    Ok(made) => {
                        eprintln!("{} for {}", token_shown(&made), text(&made["user"]));
                        println!("{}", text(&made["token"]));
                        ExitCode::SUCCESS
                    }
                    Err(code) => code,
                }
            })
        }
        TokenCommand::List { client: args, user } => {
            let path = match user {
                Some(user) => format!("/v1/tokens?user={}", encode(&user)),
                None => "/v1/tokens".to_owned(),
            };
            with_client(&args, |client| {
                match call("token list", client.get(&path)) {
                    Ok(tokens) => {
                        for token in tokens.as_array().into_iter().flatten() {
                            let at = |key: &str| match &token[key] {
                                Value::String(at) => at.clone(),
                                _ => "never".to_owned(),
                            };
                            println!(
                                "{}  {}  {}  {}  created {}  expires {}  last used {}",
                                text(&token["id"]),
                                text(&token["user"]),
                                text(&token["role"]),
                                text(&token["state"]),
                                text(&token["created_at"]),
                                at("expires_at"),
                                at("last_used_at"),
                            );
                        }
                        ExitCode::SUCCESS
                    }
                    Err(code) => code,
                }
            })
        }
        TokenCommand::Revoke { client: args, id } => {
            let path = format!("/v1/tokens/{}/revoke", encode(&id));
            with_client(&args, |client| {
                match call("token revoke", client.post(&path, "")) {
                    Ok(token) => {
                        println!("revoked {} of {}", text(&token["id"]), text(&token["user"]));
                        ExitCode::SUCCESS
                    }
                    Err(code) => code,
                }
            })
        }
        TokenCommand::Rotate {
            client: args,
            id,
            expires,
        } => {
            let mut body = json!({});
            if let Some(expires) = expires {
                body["expires"] = json!(format_duration(expires));
            }
            let path = format!("/v1/tokens/{}/rotate", encode(&id));
            with_client(&args, |client| {
                match call("token rotate", client.post(&path, &body.to_string())) {
                    Ok(made) => {
                        eprintln!(
                            "rotated: the old secret no longer works; the new {}",
                            token_shown(&made)
                        );
                        println!("{}", text(&made["token"]));
                        ExitCode::SUCCESS
                    }
                    Err(code) => code,
                }
            })
        }
    }
}

/// Percent-encodes what is not unreserved in a URL component.
fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}
