//! Just enough of the Redis protocol (RESP2) for the harness to ask a server or a sentinel
//! whether it is ready, so the harness itself needs no Redis client library.

use std::io::{self, BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

const IO_TIMEOUT: Duration = Duration::from_secs(2);

/// A reply, as RESP2 types it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reply {
    Status(String),
    Error(String),
    Integer(i64),
    Bulk(Option<Vec<u8>>),
    Array(Option<Vec<Reply>>),
}

impl Reply {
    /// The text of a status or bulk reply.
    pub(crate) fn text(&self) -> Option<String> {
        match self {
            Reply::Status(text) => Some(text.clone()),
            Reply::Bulk(Some(bytes)) => Some(String::from_utf8_lossy(bytes).into_owned()),
            _ => None,
        }
    }

    /// The elements of an array reply (none for a nil array or another type).
    pub(crate) fn items(&self) -> &[Reply] {
        match self {
            Reply::Array(Some(items)) => items,
            _ => &[],
        }
    }
}

/// Sends one command and reads its reply, on a fresh connection.
pub(crate) fn command(addr: SocketAddr, args: &[&str]) -> io::Result<Reply> {
    let mut stream = TcpStream::connect_timeout(&addr, IO_TIMEOUT)?;
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    stream.write_all(&encode(args))?;
    read_reply(&mut BufReader::new(stream))
}

fn encode(args: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        out.extend_from_slice(arg.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out
}

fn invalid(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

fn read_reply(reader: &mut impl BufRead) -> io::Result<Reply> {
    let mut line = String::new();
    if reader.read_line(&mut line)? == 0 {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    let line = line.trim_end_matches("\r\n");
    let (kind, rest) = line.split_at_checked(1).unwrap_or(("", ""));
    let number = || -> io::Result<i64> {
        rest.parse()
            .map_err(|_| invalid(format!("bad length in {line:?}")))
    };
    Ok(match kind {
        "+" => Reply::Status(rest.to_owned()),
        "-" => Reply::Error(rest.to_owned()),
        ":" => Reply::Integer(number()?),
        "$" => match usize::try_from(number()?) {
            Err(_) => Reply::Bulk(None),
            Ok(len) => {
                let mut bytes = vec![0; len + 2];
                reader.read_exact(&mut bytes)?;
                bytes.truncate(len);
                Reply::Bulk(Some(bytes))
            }
        },
        "*" => match usize::try_from(number()?) {
            Err(_) => Reply::Array(None),
            Ok(len) => Reply::Array(Some(
                (0..len)
                    .map(|_| read_reply(reader))
                    .collect::<io::Result<_>>()?,
            )),
        },
        _ => return Err(invalid(format!("not a RESP reply: {line:?}"))),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(bytes: &[u8]) -> io::Result<Reply> {
        read_reply(&mut &bytes[..])
    }

    #[test]
    fn encodes_a_command_as_an_array_of_bulk_strings() {
        assert_eq!(encode(&["PING"]), b"*1\r\n$4\r\nPING\r\n");
        assert_eq!(encode(&["GET", ""]), b"*2\r\n$3\r\nGET\r\n$0\r\n\r\n");
    }

    #[test]
    fn parses_every_reply_type() {
        assert_eq!(parse(b"+PONG\r\n").unwrap(), Reply::Status("PONG".into()));
        assert_eq!(
            parse(b"-ERR no\r\n").unwrap(),
            Reply::Error("ERR no".into())
        );
        assert_eq!(parse(b":42\r\n").unwrap(), Reply::Integer(42));
        assert_eq!(parse(b"$-1\r\n").unwrap(), Reply::Bulk(None));
        assert_eq!(parse(b"*-1\r\n").unwrap(), Reply::Array(None));
        let nested = parse(b"*2\r\n$9\r\n127.0.0.1\r\n$4\r\n6379\r\n").unwrap();
        let texts: Vec<_> = nested.items().iter().filter_map(Reply::text).collect();
        assert_eq!(texts, ["127.0.0.1", "6379"]);
    }

    #[test]
    fn bulk_strings_may_hold_line_breaks() {
        let reply = parse(b"$12\r\nrole:master\n\r\n").unwrap();
        assert_eq!(reply.text().unwrap(), "role:master\n");
    }

    #[test]
    fn rejects_garbage_and_truncation() {
        assert!(parse(b"hello\r\n").is_err());
        assert!(parse(b"$5\r\nab").is_err());
        assert!(parse(b"").is_err());
    }
}
