//! TLS to PostgreSQL as libpq does it, against a server whose certificate a test CA signed (for
//! `localhost` only): `verify-full` passes with that CA and fails with another one and with a
//! host name the certificate does not name; `verify-ca` checks the chain only; a root
//! certificate that exists is used by `require` too; a connection to another machine that is not
//! verified is warned about, once.

use std::path::Path;
use std::process::Command;

use crate::pg;
use crate::support::Project;

/// Runs openssl in `dir`; panics with its output when it fails.
fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl (Debian package `openssl`)");
    assert!(
        out.status.success(),
        "openssl {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Two CAs (`ca1`, `ca2`) and a server certificate for `localhost` signed by `ca1`, in `dir`.
fn certificates(dir: &Path) {
    for ca in ["ca1", "ca2"] {
        openssl(
            dir,
            &[
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-days",
                "30",
                "-keyout",
                &format!("{ca}.key"),
                "-out",
                &format!("{ca}.crt"),
                "-subj",
                &format!("/CN=backfill test {ca}"),
            ],
        );
    }
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=localhost",
        ],
    );
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName = DNS:localhost\nbasicConstraints = CA:FALSE\nkeyUsage = digitalSignature, keyEncipherment\nextendedKeyUsage = serverAuth\n",
    )
    .unwrap();
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca1.crt",
            "-CAkey",
            "ca1.key",
            "-CAcreateserial",
            "-days",
            "30",
            "-extfile",
            "server.ext",
            "-out",
            "server.crt",
        ],
    );
}

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn verification_follows_libpq_against_a_server_with_a_test_cas_certificate() {
    let p = Project::new();
    let certs = p.path("certs");
    std::fs::create_dir_all(&certs).unwrap();
    certificates(&certs);
    let cluster = pg::Cluster::start_tls(&certs.join("server.crt"), &certs.join("server.key"));
    let db = cluster.create_db();
    let port = cluster.port();
    let ca = |n: &str| certs.join(format!("{n}.crt")).display().to_string();
    // No ~/.postgresql/root.crt but the one a case puts there.
    let home = p.path("home");
    std::fs::create_dir_all(&home).unwrap();
    let home = home.display().to_string();
    let list = |host: &str, query: &str| {
        let url = format!("postgresql://postgres@{host}:{port}/{db}?{query}");
        p.run_with(&["--manifest", &url, "list"], &[("HOME", home.as_str())])
    };
    // The right CA, the name the certificate has.
    list(
        "localhost",
        &format!("sslmode=verify-full&sslrootcert={}", ca("ca1")),
    )
    .code(0)
    .stderr_has("no backfills yet");
    // Another CA: refused.
    list(
        "localhost",
        &format!("sslmode=verify-full&sslrootcert={}", ca("ca2")),
    )
    .code(1)
    .stderr_has("cannot connect")
    .stderr_has("certificate");
    // A name the certificate does not have: refused by verify-full, not by verify-ca.
    list(
        "127.0.0.1",
        &format!("sslmode=verify-full&sslrootcert={}", ca("ca1")),
    )
    .code(1)
    .stderr_has("cannot connect")
    .stderr_has("certificate");
    list(
        "127.0.0.1",
        &format!("sslmode=verify-ca&sslrootcert={}", ca("ca1")),
    )
    .code(0);
    // A root certificate that exists is used by require too (as libpq): the wrong one refuses.
    list(
        "localhost",
        &format!("sslmode=require&sslrootcert={}", ca("ca2")),
    )
    .code(1)
    .stderr_has("certificate");
    list(
        "localhost",
        &format!("sslmode=require&sslrootcert={}", ca("ca1")),
    )
    .code(0);
    // So is ~/.postgresql/root.crt.
    std::fs::create_dir_all(Path::new(&home).join(".postgresql")).unwrap();
    std::fs::copy(ca("ca2"), Path::new(&home).join(".postgresql/root.crt")).unwrap();
    list("localhost", "sslmode=require")
        .code(1)
        .stderr_has("certificate");
    list("localhost", "sslmode=verify-full")
        .code(1)
        .stderr_has("certificate");
    std::fs::copy(ca("ca1"), Path::new(&home).join(".postgresql/root.crt")).unwrap();
    list("localhost", "sslmode=verify-full").code(0);
    std::fs::remove_file(Path::new(&home).join(".postgresql/root.crt")).unwrap();
    // Without any root certificate: require encrypts without verifying; verify-* refuse at once.
    list("localhost", "sslmode=require").code(0);
    list("localhost", "sslmode=verify-full")
        .code(2)
        .stderr_has("sslmode=verify-full needs a root certificate");
    // This machine is not warned about; another is, once, before it is even reached.
    let out = list("localhost", "sslmode=prefer");
    assert!(!out.stderr.contains("warning:"), "{}", out.stderr);
    let out = p.run_with(
        &[
            "--manifest",
            "postgresql://etl:hunter2@db.invalid/x?connect_timeout=1",
            "list",
        ],
        &[("HOME", home.as_str())],
    );
    out.code(1).stderr_has(
        "warning: the connection to PostgreSQL on db.invalid does not verify the server (no root certificate), with sslmode=prefer",
    );
    assert_eq!(out.stderr.matches("warning:").count(), 1, "{}", out.stderr);
    assert!(!out.stderr.contains("hunter2"), "{}", out.stderr);
}
