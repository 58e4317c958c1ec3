//! PostgreSQL URLs as the program shows and keeps them: a password never shown
//! ([`redact_url`]), and the location of a manifest (a file's path, or a URL shown without its
//! password, the URL itself kept for connecting).

use std::path::{Path, PathBuf};

/// `url` without a password: `scheme://user:secret@host` loses `:secret` (the user part ends at
/// the last `@`, so a password with an unencoded `/`, `?` or `@` goes whole), and a `password=`
/// or `sslpassword=` parameter its value, however its key is written (`pass%77ord`, as the
/// driver decodes keys too).
pub(crate) fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let (authority, tail) = match rest.rfind('@') {
        Some(at) => {
            let user = &rest[..at];
            let user = user.split_once(':').map_or(user, |(u, _)| u);
            (format!("{user}@"), &rest[at + 1..])
        }
        None => (String::new(), rest),
    };
    let (head, query) = match tail.split_once('?') {
        Some((h, q)) => (h, Some(q)),
        None => (tail, None),
    };
    let mut out = format!("{scheme}://{authority}{head}");
    if let Some(q) = query {
        let params: Vec<String> = q
            .split('&')
            .map(|kv| match kv.split_once('=') {
                Some((k, _))
                    if ["password", "sslpassword"].iter().any(|secret| {
                        percent_encoding::percent_decode_str(k)
                            .decode_utf8_lossy()
                            .eq_ignore_ascii_case(secret)
                    }) =>
                {
                    format!("{k}=***")
                }
                _ => kv.to_string(),
            })
            .collect();
        out.push('?');
        out.push_str(&params.join("&"));
    }
    out
}

/// Whether a manifest location is a PostgreSQL URL.
pub(crate) fn is_url(path: &Path) -> bool {
    path.to_str().is_some_and(|s| {
        let lower = s.trim_start().to_ascii_lowercase();
        lower.starts_with("postgresql://") || lower.starts_with("postgres://")
    })
}

/// Why `value` cannot name a manifest: a libpq keyword/value string (`host=db dbname=x`) would
/// otherwise become a file name, its password with it. Never repeats the value.
pub(crate) fn not_a_location(value: &str) -> Option<String> {
    const KEYS: &[&str] = &[
        "host", "hostaddr", "port", "dbname", "user", "password", "sslmode",
    ];
    let words: Vec<&str> = value.split_whitespace().collect();
    let keyword = |w: &&str| {
        w.split_once('=')
            .is_some_and(|(k, _)| KEYS.contains(&k.to_ascii_lowercase().as_str()))
    };
    (!words.is_empty() && words.iter().any(keyword)).then(|| {
        "a libpq keyword/value string is not taken: write the manifest as a URL, postgresql://USER@HOST:PORT/DATABASE (a password through ${NAME})"
            .to_string()
    })
}

/// PostgreSQL URLs by the location that stands for them: the URL without its password.
static URLS: std::sync::LazyLock<std::sync::Mutex<std::collections::HashMap<PathBuf, String>>> =
    std::sync::LazyLock::new(Default::default);

/// The location of the manifest that `value` names: a path, or a PostgreSQL URL. A URL's
/// location is the URL without its password, so that every message may show it; the URL
/// itself is kept for connecting.
pub(crate) fn location(value: &str) -> PathBuf {
    let value = value.trim();
    if !is_url(Path::new(value)) {
        return PathBuf::from(value);
    }
    // The scheme in lower case, as libpq takes it in any case.
    let value = match value.split_once("://") {
        Some((scheme, rest)) => format!("{}://{rest}", scheme.to_ascii_lowercase()),
        None => value.to_string(),
    };
    let value = value.as_str();
    let shown = PathBuf::from(redact_url(value));
    if let Ok(mut urls) = URLS.lock() {
        urls.insert(shown.clone(), value.to_string());
    }
    shown
}

/// The URL to connect to for a location given by [`location`].
pub(crate) fn url_of(path: &Path) -> String {
    URLS.lock()
        .ok()
        .and_then(|urls| urls.get(path).cloned())
        .unwrap_or_else(|| path.to_string_lossy().into_owned())
}
