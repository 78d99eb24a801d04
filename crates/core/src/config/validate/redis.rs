//! The checks of the `redis` section: one of `url`, `sentinel` or `cluster`, URLs that parse, and a
//! password in a file or a URL but not both.

use super::*;

pub(super) const REDIS_TARGETS: &str = "`url`, `sentinel` or `cluster`";

pub(super) fn check_redis_url(check: &Checker<'_>, path: &str, url: &str) -> Result<(), Located> {
    let rest = ["redis://", "rediss://", "redis+unix://", "unix://"]
        .iter()
        .find_map(|scheme| url.strip_prefix(scheme));
    match rest {
        Some(rest) if !rest.trim().is_empty() => Ok(()),
        Some(_) => Err(check.at_value(
            path,
            format!(
                "redis address \"{}\" has no host; write redis://HOST:PORT",
                redact_url(url)
            ),
        )),
        None => Err(check.at_value(
            path,
            format!(
                "redis address \"{}\" must start with redis:// or rediss:// (TLS), like redis://127.0.0.1:6379",
                redact_url(url)
            ),
        )),
    }
}

/// `password_file` names a file, and the password is not also written in a URL (which one would
/// win would be a guess).
pub(super) fn check_password_file(check: &Checker<'_>, redis: &RedisFile) -> Result<(), Located> {
    let Some(file) = &redis.password_file else {
        return Ok(());
    };
    if file.as_os_str().is_empty() || file.to_str().is_some_and(|f| f.trim().is_empty()) {
        return Err(check.at_value(
            "redis.password_file",
            "password_file is empty; name the file that holds the Redis password, like /run/secrets/redis-password",
        ));
    }
    let urls = redis
        .url
        .iter()
        .map(|url| ("redis.url".to_owned(), url))
        .chain(
            redis
                .cluster
                .iter()
                .flatten()
                .enumerate()
                .map(|(i, url)| (item("redis.cluster", i), url)),
        );
    for (path, url) in urls {
        if url_has_password(url) {
            return Err(check.at_value(
                &path,
                format!(
                    "redis address \"{}\" carries a password and redis.password_file is set; keep the password in the file only and write the address without it",
                    redact_url(url)
                ),
            ));
        }
    }
    Ok(())
}

pub(super) fn check_redis(check: &Checker<'_>, redis: RedisFile) -> Result<Redis, Located> {
    check_password_file(check, &redis)?;
    let password_file = redis.password_file.clone();
    let given: Vec<&str> = [
        ("url", redis.url.is_some()),
        ("sentinel", redis.sentinel.is_some()),
        ("cluster", redis.cluster.is_some()),
    ]
    .into_iter()
    .filter_map(|(key, present)| present.then_some(key))
    .collect();
    if given.is_empty() {
        return Err(check.at_key(
            "redis",
            format!("redis needs one of {REDIS_TARGETS}, like `url: redis://127.0.0.1:6379`"),
        ));
    }
    if given.len() > 1 {
        let mut keys: Vec<(Position, &str)> = given
            .iter()
            .map(|key| (check.positions.key(&child("redis", key)), *key))
            .collect();
        keys.sort();
        return Err(Located {
            position: keys[1].0,
            message: format!(
                "redis takes one of {REDIS_TARGETS}, not both `{}` and `{}`",
                keys[0].1, keys[1].1
            ),
        });
    }
    let target = if let Some(url) = redis.url {
        check_redis_url(check, "redis.url", &url)?;
        RedisTarget::Single { url }
    } else if let Some(sentinel) = redis.sentinel {
        if sentinel.master.trim().is_empty() {
            return Err(check.at_value(
                "redis.sentinel.master",
                "the sentinel master's name is empty; write the name the sentinels monitor, like mymaster",
            ));
        }
        if sentinel.nodes.is_empty() {
            return Err(check.at_value(
                "redis.sentinel.nodes",
                "sentinel needs at least one node, like redis://127.0.0.1:26379",
            ));
        }
        for (i, node) in sentinel.nodes.iter().enumerate() {
            check_redis_url(check, &item("redis.sentinel.nodes", i), node)?;
        }
        RedisTarget::Sentinel {
            master: sentinel.master,
            nodes: sentinel.nodes,
        }
    } else {
        let nodes = redis.cluster.unwrap_or_default();
        if nodes.is_empty() {
            return Err(check.at_value(
                "redis.cluster",
                "cluster needs at least one node, like [redis://127.0.0.1:7000]",
            ));
        }
        for (i, node) in nodes.iter().enumerate() {
            check_redis_url(check, &item("redis.cluster", i), node)?;
        }
        RedisTarget::Cluster { nodes }
    };
    Ok(Redis {
        target,
        timeout: redis.timeout,
        password_file,
    })
}
