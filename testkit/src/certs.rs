//! Throwaway certificates for servers started with TLS, made by the
//! installed `openssl` (P-256 keys, valid two days): a CA, a server
//! certificate for `127.0.0.1` signed by it, a client certificate (common
//! name `alk`) signed by it, and a second CA that signed nothing, for
//! "the wrong CA" tests.

use std::path::{Path, PathBuf};

use crate::process;

/// The files, in the directory they were made in.
#[derive(Debug, Clone)]
pub struct Certificates {
    /// The CA's certificate (PEM).
    pub ca: PathBuf,
    /// The server's certificate, for `127.0.0.1` (server and client use,
    /// as etcd dials itself with it).
    pub server_cert: PathBuf,
    /// The server certificate's key.
    pub server_key: PathBuf,
    /// A client certificate, common name `alk`.
    pub client_cert: PathBuf,
    /// The client certificate's key.
    pub client_key: PathBuf,
    /// A CA that signed none of them.
    pub other_ca: PathBuf,
}

impl Certificates {
    /// Makes them in `dir`.
    pub fn make(dir: &Path) -> Result<Certificates, String> {
        let openssl = process::find_tool("openssl").ok_or("no openssl binary found")?;
        let path = |name: &str| dir.join(name);
        let text = |p: &Path| p.to_str().map(str::to_owned).ok_or("temp dir not UTF-8");
        let openssl = |args: &[&str]| process::run(&openssl, args, None);
        let new_key = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        // Named apart: a verifier looks the issuer up by name.
        for (ca, subject) in [
            ("ca", "/CN=alkstore test CA"),
            ("other-ca", "/CN=alkstore other test CA"),
        ] {
            let (key, cert) = (
                text(&path(&format!("{ca}.key")))?,
                text(&path(&format!("{ca}.pem")))?,
            );
            let mut args = vec!["req", "-x509"];
            args.extend(new_key);
            args.extend([
                "-keyout", &key, "-out", &cert, "-days", "2", "-subj", subject,
            ]);
            openssl(&args)?;
        }
        for (name, subject, usage) in [
            ("server", "/CN=127.0.0.1", "serverAuth,clientAuth"),
            ("client", "/CN=alk", "clientAuth"),
        ] {
            let (key, csr, cert, ext) = (
                text(&path(&format!("{name}.key")))?,
                text(&path(&format!("{name}.csr")))?,
                text(&path(&format!("{name}.pem")))?,
                path(&format!("{name}.ext")),
            );
            std::fs::write(
                &ext,
                format!(
                    "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\n\
                     extendedKeyUsage={usage}\nsubjectAltName=IP:127.0.0.1\n"
                ),
            )
            .map_err(|e| format!("cannot write {}: {e}", ext.display()))?;
            let mut args = vec!["req"];
            args.extend(new_key);
            args.extend(["-keyout", &key, "-out", &csr, "-subj", subject]);
            openssl(&args)?;
            let (ca, ca_key, ext) = (text(&path("ca.pem"))?, text(&path("ca.key"))?, text(&ext)?);
            openssl(&[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                &ca,
                "-CAkey",
                &ca_key,
                "-CAcreateserial",
                "-out",
                &cert,
                "-days",
                "2",
                "-extfile",
                &ext,
            ])?;
        }
        Ok(Certificates {
            ca: path("ca.pem"),
            server_cert: path("server.pem"),
            server_key: path("server.key"),
            client_cert: path("client.pem"),
            client_key: path("client.key"),
            other_ca: path("other-ca.pem"),
        })
    }
}
