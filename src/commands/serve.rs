//! `backfill serve`: its options checked (the address, the token, the manifest), then the
//! status page ([`crate::serve`]) served until Ctrl-C or SIGTERM.

use std::net::{SocketAddr, ToSocketAddrs};

use crate::exit::{self, Error};
use crate::session::Global;

pub(crate) fn run(g: &Global, listen: &str, token: Option<String>) -> Result<u8, Error> {
    let addr = address(listen)?;
    let token = token.filter(|t| !t.is_empty());
    if let Some(t) = &token
        && (t.len() < 8
            || !t
                .bytes()
                .all(|c| c.is_ascii_alphanumeric() || b"._~-".contains(&c)))
    {
        return Err(Error::Usage(
            "--token (or BACKFILL_SERVE_TOKEN): give at least 8 characters, each a letter, a digit or one of . _ ~ - (they travel in an address and a cookie as they are), such as the output of `openssl rand -hex 16`".into(),
        ));
    }
    if !addr.ip().is_loopback() && token.is_none() {
        return Err(Error::Usage(format!(
            "--listen {listen}: another address than loopback lets every host that reaches it read the manifest; give --token (or BACKFILL_SERVE_TOKEN) as well, which every request must then carry"
        )));
    }
    let project = g.project().ok();
    let manifest = g.manifest_path(project.as_ref())?;
    crate::serve::run(crate::serve::Options {
        addr,
        listen: listen.to_string(),
        token,
        manifest,
        project,
        quiet: g.quiet,
    })?;
    Ok(exit::OK)
}

/// The address to listen on, from `--listen`.
fn address(listen: &str) -> Result<SocketAddr, Error> {
    let bad = || {
        Error::Usage(format!(
            "--listen {listen}: not an address to listen on; give HOST:PORT, such as 127.0.0.1:8460 or [::1]:8460"
        ))
    };
    listen
        .to_socket_addrs()
        .map_err(|_| bad())?
        .next()
        .ok_or_else(bad)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_addresses() {
        assert!(address("127.0.0.1:8460").unwrap().ip().is_loopback());
        assert!(address("[::1]:0").unwrap().ip().is_loopback());
        assert!(matches!(address("8460"), Err(Error::Usage(_))));
        assert!(matches!(address("nowhere:x"), Err(Error::Usage(_))));
    }
}
