//! `bigfleet pki`: the chart's own certificate authority (ADR-0110).
//!
//! * `install-secrets` runs in the chart's pre-install/pre-upgrade hook Job. It keeps one CA
//!   Secret per release (created once, then only ever read: the CA is never rotated
//!   silently) and one `kubernetes.io/tls` Secret per role (`tls.crt`, `tls.key`, `ca.crt`),
//!   created when missing and re-issued when its CA, identity or DNS names no longer match
//!   or it expires within `--renew-before`. Secrets it did not create are never touched.
//!   Identities and DNS names follow the chart's naming (`--prefix` is the release's full
//!   name): coordinator replica *i* is `bigfleet://coordinator/<prefix>-coordinator-<i>`,
//!   shard *i* `bigfleet://shard/<prefix>-shard-<i>`, its remote workers
//!   `bigfleet://shard/<prefix>-shard-<i>/execute`, inspect `bigfleet://readonly`.
//! * `issue` issues one leaf from a CA on disk (an admin certificate for the CLI, say).

pub mod kube;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use bigfleet_identity::TlsFiles;
use bigfleet_identity::ca::{
    CaError, CertInfo, CertificateAuthority, LeafRequest, key_matches_cert,
};
use clap::{Args, Subcommand};
use rustls::pki_types::pem::PemObject;
use serde::Serialize;
use serde_json::{Value, json};

use self::kube::{KubeClient, KubeError, SERVICE_ACCOUNT_DIR};

/// The label on every Secret `install-secrets` manages; Secrets without it are never
/// overwritten.
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "bigfleet-pki");
/// The annotation naming a leaf Secret's identity (for people reading the Secret).
pub const IDENTITY_ANNOTATION: &str = "bigfleet/identity";

#[derive(Debug, Clone, Subcommand)]
pub enum PkiCommand {
    /// Create the release's CA Secret once and create or renew every role's
    /// kubernetes.io/tls Secret through the Kubernetes API (the chart's hook Job).
    InstallSecrets(InstallSecretsArgs),
    /// Issue one certificate from a CA on disk into DIR (NAME.crt, NAME.key, ca.crt).
    Issue(IssueArgs),
    /// Write a revocation list naming the given certificates, signed by a CA on disk;
    /// serve it to every process with --tls-crl (it is re-read when it changes).
    Crl(CrlArgs),
}

fn duration(s: &str) -> Result<Duration, humantime::DurationError> {
    humantime::parse_duration(s)
}

#[derive(Debug, Clone, Args)]
pub struct InstallSecretsArgs {
    /// Namespace of the Secrets (default: this pod's namespace).
    #[arg(long)]
    pub namespace: Option<String>,
    /// The release's full name: replica ids, Service names and default Secret names
    /// derive from it.
    #[arg(long)]
    pub prefix: String,
    /// Coordinator replicas: one certificate per ordinal.
    #[arg(long, default_value_t = 0)]
    pub coordinators: u32,
    /// Shards: one certificate per ordinal.
    #[arg(long, default_value_t = 0)]
    pub shards: u32,
    /// Shards with remote execute workers (ordinals 0..N): one execute certificate each.
    #[arg(long, default_value_t = 0)]
    pub execute_shards: u32,
    /// The CA Secret (default: PREFIX-ca).
    #[arg(long, value_name = "NAME")]
    pub ca_secret: Option<String>,
    /// Coordinator Secrets are NAME-0, NAME-1, ... (default: PREFIX-coordinator-tls).
    #[arg(long, value_name = "NAME")]
    pub coordinator_secret_prefix: Option<String>,
    /// Shard Secrets are NAME-0, NAME-1, ... (default: PREFIX-shard-tls).
    #[arg(long, value_name = "NAME")]
    pub shard_secret_prefix: Option<String>,
    /// Execute Secrets are NAME-0, NAME-1, ... (default: PREFIX-execute-tls).
    #[arg(long, value_name = "NAME")]
    pub execute_secret_prefix: Option<String>,
    /// Issue the inspect (bigfleet://readonly) certificate into this Secret.
    #[arg(long, value_name = "NAME")]
    pub inspect_secret: Option<String>,
    /// Extra label on every Secret created or renewed (repeatable).
    #[arg(long = "label", value_name = "KEY=VALUE")]
    pub labels: Vec<String>,
    /// Lifetime of a newly created CA.
    #[arg(long, default_value = "87600h", value_parser = duration)]
    pub ca_validity: Duration,
    /// Lifetime of each issued certificate.
    #[arg(long, default_value = "8760h", value_parser = duration)]
    pub leaf_validity: Duration,
    /// Re-issue certificates that expire within this window.
    #[arg(long, default_value = "2160h", value_parser = duration)]
    pub renew_before: Duration,
    /// Where the pod's service-account token, ca.crt and namespace are.
    #[arg(long, default_value = SERVICE_ACCOUNT_DIR, value_name = "DIR")]
    pub service_account_dir: PathBuf,
    /// Print the Secrets that would be managed and exit without calling the API.
    #[arg(long)]
    pub dry_run: bool,
}

#[derive(Debug, Clone, Args)]
pub struct IssueArgs {
    /// PEM certificate of the CA.
    #[arg(long, value_name = "PATH")]
    pub ca_cert: PathBuf,
    /// PEM (PKCS#8) private key of the CA.
    #[arg(long, value_name = "PATH")]
    pub ca_key: PathBuf,
    /// The identity: admin, readonly, cluster/ID, shard/ID, shard/ID/execute,
    /// coordinator/ID (the bigfleet:// prefix is optional).
    #[arg(long)]
    pub identity: String,
    /// Extra DNS name (repeatable).
    #[arg(long = "dns", value_name = "NAME")]
    pub dns_names: Vec<String>,
    /// Extra IP address (repeatable).
    #[arg(long = "ip", value_name = "IP")]
    pub ips: Vec<IpAddr>,
    #[arg(long, default_value = "24h", value_parser = duration)]
    pub validity: Duration,
    /// Directory to write NAME.crt, NAME.key (mode 0600) and ca.crt into (created).
    #[arg(long, value_name = "DIR")]
    pub out_dir: PathBuf,
    /// File name stem (default: from the identity, e.g. admin, cluster-c1).
    #[arg(long)]
    pub name: Option<String>,
}

#[derive(Debug, Clone, Args)]
pub struct CrlArgs {
    /// PEM certificate of the CA.
    #[arg(long, value_name = "PATH")]
    pub ca_cert: PathBuf,
    /// PEM (PKCS#8) private key of the CA.
    #[arg(long, value_name = "PATH")]
    pub ca_key: PathBuf,
    /// A PEM certificate to revoke (repeatable; none writes an empty list).
    #[arg(long = "revoke", value_name = "PATH")]
    pub revoke: Vec<PathBuf>,
    /// The list's sequence number: each new list of a CA must use a higher one (default:
    /// the current Unix time, which always grows).
    #[arg(long)]
    pub number: Option<u64>,
    /// How long the list is valid (its nextUpdate).
    #[arg(long, default_value = "720h", value_parser = duration)]
    pub validity: Duration,
    /// Where to write the PEM list (replaced atomically).
    #[arg(long, value_name = "PATH")]
    pub out: PathBuf,
}

/// Why `bigfleet pki` failed.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Kube(#[from] KubeError),
    #[error(transparent)]
    Ca(#[from] CaError),
    #[error("secret {namespace}/{name}: {reason}")]
    Secret {
        namespace: String,
        name: String,
        reason: String,
    },
}

/// One role Secret to keep: its name, the identity URI SAN and the DNS names of its leaf.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PlannedSecret {
    pub name: String,
    pub identity: String,
    pub dns_names: Vec<String>,
}

/// Everything `install-secrets` manages in one namespace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Plan {
    pub namespace: String,
    pub ca_secret: String,
    pub secrets: Vec<PlannedSecret>,
    pub labels: BTreeMap<String, String>,
}

impl Plan {
    /// The Secrets of a release named `args.prefix` in `namespace`, named and addressed as
    /// the chart names and addresses its workloads.
    pub fn new(args: &InstallSecretsArgs, namespace: &str) -> Result<Self, PkiError> {
        let p = args.prefix.as_str();
        check_name("--prefix", p, 40)?;
        check_name("--namespace", namespace, 63)?;
        if args.execute_shards > args.shards {
            return Err(PkiError::Invalid(format!(
                "--execute-shards {} is more than --shards {}: execute workers serve this release's shards",
                args.execute_shards, args.shards
            )));
        }
        let named = |given: &Option<String>, default: String| given.clone().unwrap_or(default);
        let coordinator_secret = named(
            &args.coordinator_secret_prefix,
            format!("{p}-coordinator-tls"),
        );
        let shard_secret = named(&args.shard_secret_prefix, format!("{p}-shard-tls"));
        let execute_secret = named(&args.execute_secret_prefix, format!("{p}-execute-tls"));
        let coordinator_host = format!("{p}-coordinator.{namespace}.svc");
        let mut secrets = Vec::new();
        for i in 0..args.coordinators {
            let id = format!("{p}-coordinator-{i}");
            secrets.push(PlannedSecret {
                name: format!("{coordinator_secret}-{i}"),
                identity: format!("bigfleet://coordinator/{id}"),
                dns_names: vec![coordinator_host.clone(), format!("{id}.{coordinator_host}")],
            });
        }
        for i in 0..args.shards {
            let pod = format!("{p}-shard-{i}");
            secrets.push(PlannedSecret {
                name: format!("{shard_secret}-{i}"),
                identity: format!("bigfleet://shard/{pod}"),
                dns_names: vec![format!("{pod}.{p}-shard-headless.{namespace}.svc")],
            });
        }
        for i in 0..args.execute_shards {
            secrets.push(PlannedSecret {
                name: format!("{execute_secret}-{i}"),
                identity: format!("bigfleet://shard/{p}-shard-{i}/execute"),
                dns_names: Vec::new(),
            });
        }
        if let Some(name) = &args.inspect_secret {
            secrets.push(PlannedSecret {
                name: name.clone(),
                identity: "bigfleet://readonly".to_owned(),
                dns_names: vec![format!("{p}-inspect.{namespace}.svc")],
            });
        }
        let ca_secret = named(&args.ca_secret, format!("{p}-ca"));
        check_name("CA secret", &ca_secret, 253)?;
        for s in &secrets {
            check_name("secret", &s.name, 253)?;
            if s.name == ca_secret {
                return Err(PkiError::Invalid(format!(
                    "secret {} is both the CA and a role secret",
                    s.name
                )));
            }
        }
        let mut labels = BTreeMap::new();
        for l in &args.labels {
            let (k, v) = l
                .split_once('=')
                .ok_or_else(|| PkiError::Invalid(format!("--label {l:?} is not KEY=VALUE")))?;
            labels.insert(k.to_owned(), v.to_owned());
        }
        labels.insert(MANAGED_BY.0.to_owned(), MANAGED_BY.1.to_owned());
        labels.insert(
            "app.kubernetes.io/part-of".to_owned(),
            "bigfleet".to_owned(),
        );
        Ok(Self {
            namespace: namespace.to_owned(),
            ca_secret,
            secrets,
            labels,
        })
    }
}

/// Lifetimes used by [`install_secrets`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lifetimes {
    pub ca: Duration,
    pub leaf: Duration,
    pub renew_before: Duration,
}

/// What happened to one Secret.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SecretAction {
    Created,
    Reused,
    Renewed,
    Unchanged,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SecretOutcome {
    pub name: String,
    pub identity: Option<String>,
    pub action: SecretAction,
    /// Why a Secret was renewed.
    pub reason: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct InstallReport {
    pub namespace: String,
    pub ca: SecretOutcome,
    /// RFC 3339.
    pub ca_not_after: String,
    pub secrets: Vec<SecretOutcome>,
    pub warnings: Vec<String>,
}

impl SecretAction {
    pub fn as_str(self) -> &'static str {
        match self {
            SecretAction::Created => "created",
            SecretAction::Reused => "reused",
            SecretAction::Renewed => "renewed",
            SecretAction::Unchanged => "unchanged",
        }
    }
}

impl InstallReport {
    /// One line per Secret (warnings go to stderr separately).
    pub fn render(&self) -> String {
        let mut out = format!(
            "{}/{}: ca {}, valid until {}\n",
            self.namespace,
            self.ca.name,
            self.ca.action.as_str(),
            self.ca_not_after
        );
        for s in &self.secrets {
            out.push_str(&format!(
                "{}/{}: {} {}",
                self.namespace,
                s.name,
                s.identity.as_deref().unwrap_or("-"),
                s.action.as_str()
            ));
            if let Some(r) = &s.reason {
                out.push_str(&format!(" ({r})"));
            }
            out.push('\n');
        }
        out
    }
}

/// Keeps the CA Secret and every planned role Secret (see the module docs).
pub async fn install_secrets(
    client: &KubeClient,
    plan: &Plan,
    lifetimes: Lifetimes,
) -> Result<InstallReport, PkiError> {
    let (ca, ca_outcome) = ensure_ca(client, plan, lifetimes).await?;
    let mut warnings = Vec::new();
    let ca_left = ca
        .not_after()
        .duration_since(SystemTime::now())
        .unwrap_or_default();
    if ca_left < lifetimes.renew_before {
        warnings.push(format!(
            "the CA in {} expires {} and is never rotated automatically: rotate it by hand (docs/deploy.md, ADR-0110)",
            plan.ca_secret,
            humantime::format_rfc3339_seconds(ca.not_after())
        ));
    }
    let mut secrets = Vec::new();
    for planned in &plan.secrets {
        secrets.push(ensure_leaf(client, plan, &ca, planned, lifetimes).await?);
    }
    Ok(InstallReport {
        namespace: plan.namespace.clone(),
        ca: ca_outcome,
        ca_not_after: humantime::format_rfc3339_seconds(ca.not_after()).to_string(),
        secrets,
        warnings,
    })
}

async fn ensure_ca(
    client: &KubeClient,
    plan: &Plan,
    lifetimes: Lifetimes,
) -> Result<(CertificateAuthority, SecretOutcome), PkiError> {
    let ns = &plan.namespace;
    let name = &plan.ca_secret;
    let outcome = |action| SecretOutcome {
        name: name.clone(),
        identity: None,
        action,
        reason: None,
    };
    // Two rounds: a CA created by someone else between our read and our create is read
    // and used on the second.
    for _ in 0..2 {
        if let Some(secret) = client.get_secret(ns, name).await? {
            // Any Secret under this name is the CA, including one the user created before
            // install (bring your own CA). It is read, never replaced.
            let bad = |reason: String| PkiError::Secret {
                namespace: ns.clone(),
                name: name.clone(),
                reason: format!(
                    "{reason}; the CA Secret is never replaced automatically: repair or delete it (ADR-0110)"
                ),
            };
            let cert = secret_text(&secret, "tls.crt").map_err(&bad)?;
            let key = secret_text(&secret, "tls.key").map_err(&bad)?;
            let ca = CertificateAuthority::from_pem(&cert, &key)
                .map_err(|e| bad(format!("holds no usable CA: {e}")))?;
            return Ok((ca, outcome(SecretAction::Reused)));
        }
        let ca = CertificateAuthority::create(&format!("{name} (bigfleet)"), lifetimes.ca)?;
        let body = tls_secret(
            plan,
            name,
            ca.cert_pem(),
            &ca.key_pem(),
            ca.cert_pem(),
            BTreeMap::new(),
        );
        match client.create_secret(ns, &body).await {
            Ok(_) => return Ok((ca, outcome(SecretAction::Created))),
            Err(e) if e.status() == Some(http::StatusCode::CONFLICT) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(PkiError::Secret {
        namespace: ns.clone(),
        name: name.clone(),
        reason: "created concurrently but cannot be read back".to_owned(),
    })
}

async fn ensure_leaf(
    client: &KubeClient,
    plan: &Plan,
    ca: &CertificateAuthority,
    planned: &PlannedSecret,
    lifetimes: Lifetimes,
) -> Result<SecretOutcome, PkiError> {
    let ns = &plan.namespace;
    let outcome = |action, reason| SecretOutcome {
        name: planned.name.clone(),
        identity: Some(planned.identity.clone()),
        action,
        reason,
    };
    let mut request = LeafRequest::new(&planned.identity)?.with_validity(lifetimes.leaf);
    for dns in &planned.dns_names {
        request = request.with_dns_name(dns);
    }
    let annotations = BTreeMap::from([(IDENTITY_ANNOTATION.to_owned(), planned.identity.clone())]);
    // A new leaf in the Secret's shape, whether it creates the Secret or renews it.
    let issue_secret = || -> Result<Value, PkiError> {
        let leaf = ca.issue(&request)?;
        Ok(tls_secret(
            plan,
            &planned.name,
            &leaf.cert_pem,
            &leaf.key_pem,
            ca.cert_pem(),
            annotations,
        ))
    };
    match client.get_secret(ns, &planned.name).await? {
        None => {
            let body = issue_secret()?;
            client.create_secret(ns, &body).await?;
            Ok(outcome(SecretAction::Created, None))
        }
        Some(existing) => {
            if label(&existing, MANAGED_BY.0) != Some(MANAGED_BY.1) {
                return Err(PkiError::Secret {
                    namespace: ns.clone(),
                    name: planned.name.clone(),
                    reason: format!(
                        "exists without the label {}={}, so it was not created by bigfleet pki; refusing to overwrite it (delete it, or supply every Secret yourself with tls.chartCA.enabled=false)",
                        MANAGED_BY.0, MANAGED_BY.1
                    ),
                });
            }
            let Some(reason) = renewal_reason(&existing, ca, planned, lifetimes.renew_before)
            else {
                return Ok(outcome(SecretAction::Unchanged, None));
            };
            let fresh = issue_secret()?;
            let mut updated = existing;
            // Keep whatever else is on the object (other labels, owner references, the
            // resourceVersion that makes the replace conditional); replace data and ours.
            updated["data"] = fresh["data"].clone();
            for field in ["labels", "annotations"] {
                let ours = fresh["metadata"][field]
                    .as_object()
                    .cloned()
                    .unwrap_or_default();
                let meta = &mut updated["metadata"];
                if !meta[field].is_object() {
                    meta[field] = json!({});
                }
                for (k, v) in ours {
                    meta[field][k] = v;
                }
            }
            client.replace_secret(ns, &planned.name, &updated).await?;
            Ok(outcome(SecretAction::Renewed, Some(reason)))
        }
    }
}

/// Why an existing managed Secret must be re-issued; `None` keeps it.
fn renewal_reason(
    secret: &Value,
    ca: &CertificateAuthority,
    planned: &PlannedSecret,
    renew_before: Duration,
) -> Option<String> {
    let (cert, key, ca_pem) = match (
        secret_text(secret, "tls.crt"),
        secret_text(secret, "tls.key"),
        secret_text(secret, "ca.crt"),
    ) {
        (Ok(c), Ok(k), Ok(a)) => (c, k, a),
        (c, k, a) => {
            let missing = [c.err(), k.err(), a.err()];
            return Some(missing.into_iter().flatten().collect::<Vec<_>>().join(", "));
        }
    };
    if ca_pem.trim() != ca.cert_pem().trim() {
        return Some("ca.crt is not the current CA".to_owned());
    }
    let info = match CertInfo::from_pem(&cert) {
        Ok(info) => info,
        Err(e) => return Some(format!("tls.crt: {e}")),
    };
    if info.identity_uris != [planned.identity.clone()] {
        return Some(format!(
            "identity {:?} should be {}",
            info.identity_uris, planned.identity
        ));
    }
    let (mut have, mut want) = (info.dns_names.clone(), planned.dns_names.clone());
    have.sort();
    want.sort();
    if have != want {
        return Some(format!("DNS names {have:?} should be {want:?}"));
    }
    let der = match rustls::pki_types::CertificateDer::from_pem_slice(cert.as_bytes()) {
        Ok(der) => der,
        Err(e) => return Some(format!("tls.crt: {e}")),
    };
    if let Err(e) = ca.verify(&der) {
        return Some(e.to_string());
    }
    if !key_matches_cert(&der, &key) {
        return Some("tls.key does not belong to tls.crt".to_owned());
    }
    let left = info
        .not_after
        .duration_since(SystemTime::now())
        .unwrap_or_default();
    if left < renew_before {
        return Some(format!(
            "expires {}",
            humantime::format_rfc3339_seconds(info.not_after)
        ));
    }
    None
}

/// A kubernetes.io/tls Secret in the cert-manager layout.
fn tls_secret(
    plan: &Plan,
    name: &str,
    cert_pem: &str,
    key_pem: &str,
    ca_pem: &str,
    annotations: BTreeMap<String, String>,
) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": name,
            "namespace": plan.namespace,
            "labels": plan.labels,
            "annotations": annotations,
        },
        "type": "kubernetes.io/tls",
        "data": {
            "tls.crt": BASE64.encode(cert_pem),
            "tls.key": BASE64.encode(key_pem),
            "ca.crt": BASE64.encode(ca_pem),
        },
    })
}

fn label<'a>(secret: &'a Value, key: &str) -> Option<&'a str> {
    secret["metadata"]["labels"][key].as_str()
}

/// A Secret's `data[key]`, decoded as UTF-8 text.
fn secret_text(secret: &Value, key: &str) -> Result<String, String> {
    let encoded = secret["data"][key]
        .as_str()
        .ok_or_else(|| format!("no {key}"))?;
    let bytes = BASE64
        .decode(encoded)
        .map_err(|e| format!("{key} is not base64: {e}"))?;
    String::from_utf8(bytes).map_err(|_| format!("{key} is not text"))
}

/// Kubernetes object names (DNS-1123 subdomains) and namespaces (labels): lower-case
/// alphanumerics, `-` and (names only) `.`, alphanumeric at both ends.
fn check_name(what: &str, name: &str, max: usize) -> Result<(), PkiError> {
    let dots = max > 63;
    let ok = !name.is_empty()
        && name.len() <= max
        && name.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || (dots && b == b'.')
        })
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric());
    if ok {
        Ok(())
    } else {
        Err(PkiError::Invalid(format!(
            "{what} {name:?} is not a valid Kubernetes name (lower-case alphanumerics and '-', at most {max} characters)"
        )))
    }
}

/// `bigfleet pki install-secrets`: the plan (always printed under `--dry-run`), then the
/// API calls.
pub async fn run_install_secrets(
    args: &InstallSecretsArgs,
    timeout: Duration,
    env: impl Fn(&str) -> Option<String>,
) -> Result<PkiOutput, PkiError> {
    let namespace = match &args.namespace {
        Some(ns) => ns.clone(),
        None if args.dry_run => {
            return Err(PkiError::Invalid("--dry-run needs --namespace".into()));
        }
        None => kube::own_namespace(&args.service_account_dir)?,
    };
    let plan = Plan::new(args, &namespace)?;
    if args.dry_run {
        return Ok(PkiOutput::Plan(plan));
    }
    let client = KubeClient::in_cluster(env, &args.service_account_dir, timeout)?;
    let lifetimes = Lifetimes {
        ca: args.ca_validity,
        leaf: args.leaf_validity,
        renew_before: args.renew_before,
    };
    Ok(PkiOutput::Installed(
        install_secrets(&client, &plan, lifetimes).await?,
    ))
}

/// `bigfleet pki issue`.
pub fn run_issue(args: &IssueArgs) -> Result<PkiOutput, PkiError> {
    let ca = CertificateAuthority::load(&args.ca_cert, &args.ca_key)?;
    let mut request = LeafRequest::new(&args.identity)?.with_validity(args.validity);
    for dns in &args.dns_names {
        request = request.with_dns_name(dns);
    }
    for ip in &args.ips {
        request = request.with_ip(*ip);
    }
    let stem = match &args.name {
        Some(n) => n.clone(),
        None => request
            .identity()
            .trim_start_matches("bigfleet://")
            .replace('/', "-"),
    };
    std::fs::create_dir_all(&args.out_dir).map_err(|source| CaError::Io {
        path: args.out_dir.clone(),
        source,
    })?;
    let leaf = ca.issue(&request)?;
    let files = leaf.write_bundle(&args.out_dir, &stem, ca.cert_pem())?;
    Ok(PkiOutput::Issued(IssuedFiles {
        identity: leaf.identity.clone(),
        not_after: humantime::format_rfc3339_seconds(leaf.not_after).to_string(),
        files,
    }))
}

/// `bigfleet pki crl`: signs a revocation list for the given certificates.
pub fn run_crl(args: &CrlArgs) -> Result<PkiOutput, PkiError> {
    let ca = CertificateAuthority::load(&args.ca_cert, &args.ca_key)?;
    let mut ders = Vec::with_capacity(args.revoke.len());
    for path in &args.revoke {
        let pem = std::fs::read(path).map_err(|source| CaError::Io {
            path: path.clone(),
            source,
        })?;
        let der = rustls::pki_types::CertificateDer::from_pem_slice(&pem)
            .map_err(|e| PkiError::Invalid(format!("{}: {e}", path.display())))?;
        ca.verify(der.as_ref()).map_err(|e| {
            PkiError::Invalid(format!(
                "{}: not a certificate of this CA ({e})",
                path.display()
            ))
        })?;
        ders.push(der.to_vec());
    }
    let number = args.number.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_secs())
    });
    let refs: Vec<&[u8]> = ders.iter().map(Vec::as_slice).collect();
    let pem = ca.revocation_list(&refs, number, args.validity)?;
    let tmp = args.out.with_extension("crl.tmp");
    std::fs::write(&tmp, pem.as_bytes())
        .and_then(|()| std::fs::rename(&tmp, &args.out))
        .map_err(|source| CaError::Io {
            path: args.out.clone(),
            source,
        })?;
    Ok(PkiOutput::Crl(CrlWritten {
        path: args.out.clone(),
        revoked: args.revoke.len(),
        number,
    }))
}

#[derive(Debug, Clone, Serialize)]
pub struct CrlWritten {
    pub path: PathBuf,
    pub revoked: usize,
    pub number: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct IssuedFiles {
    pub identity: String,
    pub not_after: String,
    #[serde(serialize_with = "serialize_files")]
    pub files: TlsFiles,
}

fn serialize_files<S: serde::Serializer>(f: &TlsFiles, s: S) -> Result<S::Ok, S::Error> {
    json!({"cert": f.cert, "key": f.key, "ca": f.ca}).serialize(s)
}

/// What a `bigfleet pki` command produced.
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum PkiOutput {
    Plan(Plan),
    Installed(InstallReport),
    Issued(IssuedFiles),
    Crl(CrlWritten),
}

impl PkiOutput {
    /// The human rendering (`-o json` serialises the value instead).
    pub fn render(&self) -> String {
        match self {
            PkiOutput::Plan(plan) => {
                let mut out = format!("{}/{}: ca\n", plan.namespace, plan.ca_secret);
                for s in &plan.secrets {
                    out.push_str(&format!(
                        "{}/{}: {} {}\n",
                        plan.namespace,
                        s.name,
                        s.identity,
                        s.dns_names.join(",")
                    ));
                }
                out
            }
            PkiOutput::Installed(report) => report.render(),
            PkiOutput::Issued(i) => format!(
                "issued {} (valid until {}): --tls-cert {} --tls-key {} --tls-ca {}\n",
                i.identity,
                i.not_after,
                i.files.cert.display(),
                i.files.key.display(),
                i.files.ca.display()
            ),
            PkiOutput::Crl(c) => format!(
                "wrote {} (number {}, {} revoked): serve it with --tls-crl\n",
                c.path.display(),
                c.number,
                c.revoked
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn args(extra: &[&str]) -> InstallSecretsArgs {
        #[derive(Debug, Parser)]
        struct Cli {
            #[command(flatten)]
            a: InstallSecretsArgs,
        }
        let mut argv = vec!["x", "--prefix", "bf"];
        argv.extend_from_slice(extra);
        Cli::try_parse_from(argv).unwrap().a
    }

    #[test]
    fn the_plan_follows_the_chart_naming() {
        let a = args(&[
            "--coordinators=2",
            "--shards=2",
            "--execute-shards=1",
            "--inspect-secret=bf-inspect-tls",
            "--label=app.kubernetes.io/instance=bf",
        ]);
        let plan = Plan::new(&a, "ns").unwrap();
        assert_eq!(plan.ca_secret, "bf-ca");
        let rows: Vec<(&str, &str, Vec<&str>)> = plan
            .secrets
            .iter()
            .map(|s| {
                (
                    s.name.as_str(),
                    s.identity.as_str(),
                    s.dns_names.iter().map(String::as_str).collect(),
                )
            })
            .collect();
        assert_eq!(
            rows,
            vec![
                (
                    "bf-coordinator-tls-0",
                    "bigfleet://coordinator/bf-coordinator-0",
                    vec![
                        "bf-coordinator.ns.svc",
                        "bf-coordinator-0.bf-coordinator.ns.svc"
                    ]
                ),
                (
                    "bf-coordinator-tls-1",
                    "bigfleet://coordinator/bf-coordinator-1",
                    vec![
                        "bf-coordinator.ns.svc",
                        "bf-coordinator-1.bf-coordinator.ns.svc"
                    ]
                ),
                (
                    "bf-shard-tls-0",
                    "bigfleet://shard/bf-shard-0",
                    vec!["bf-shard-0.bf-shard-headless.ns.svc"]
                ),
                (
                    "bf-shard-tls-1",
                    "bigfleet://shard/bf-shard-1",
                    vec!["bf-shard-1.bf-shard-headless.ns.svc"]
                ),
                (
                    "bf-execute-tls-0",
                    "bigfleet://shard/bf-shard-0/execute",
                    vec![]
                ),
                (
                    "bf-inspect-tls",
                    "bigfleet://readonly",
                    vec!["bf-inspect.ns.svc"]
                ),
            ]
        );
        assert_eq!(plan.labels["app.kubernetes.io/instance"], "bf");
        assert_eq!(plan.labels[MANAGED_BY.0], MANAGED_BY.1);
    }

    #[test]
    fn secret_names_can_be_overridden_and_are_validated() {
        let a = args(&[
            "--shards=1",
            "--shard-secret-prefix=my-shards",
            "--ca-secret=my-ca",
        ]);
        let plan = Plan::new(&a, "ns").unwrap();
        assert_eq!(plan.ca_secret, "my-ca");
        assert_eq!(plan.secrets[0].name, "my-shards-0");
        for bad in [
            args(&["--shards=1", "--execute-shards=2"]),
            args(&["--inspect-secret=Bad_Name"]),
            args(&["--inspect-secret=bf-ca"]),
            args(&["--label=novalue"]),
            args(&["--inspect-secret=../x"]),
        ] {
            assert!(
                matches!(Plan::new(&bad, "ns"), Err(PkiError::Invalid(_))),
                "{bad:?}"
            );
        }
        assert!(Plan::new(&args(&[]), "Not/A/Namespace").is_err());
    }
}
