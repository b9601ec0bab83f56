//! etcd over TLS with client-certificate authentication.

use std::time::Duration;

use bigfleet_shardlease::testing::{EtcdServer, ServerTls};
use bigfleet_shardlease::{EtcdConfig, EtcdShards, EtcdTls, ShardLeaseError};
use bigfleet_testkit::{LeafSpec, TestCa};

#[tokio::test]
async fn epochs_over_mutual_tls() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("etcd-ca").unwrap();
    // A loopback leaf for `common_name`, written as `<stem>.crt`/`.key` next to the CA.
    let bundle = |stem: &str, common_name: &str| {
        let leaf = ca.issue(&LeafSpec::loopback(common_name)).unwrap();
        ca.write_bundle(dir.path(), stem, &leaf).unwrap()
    };
    let server = bundle("server", "etcd");
    let client = bundle("client", "decide");
    let client_tls = EtcdTls {
        ca: client.ca.clone(),
        cert: Some(client.cert.clone()),
        key: Some(client.key.clone()),
    };
    let Some(etcd) = EtcdServer::start_tls_or_skip(
        ServerTls {
            cert: server.cert,
            key: server.key,
            ca: server.ca,
        },
        client_tls.clone(),
    )
    .await
    else {
        return;
    };
    assert!(etcd.endpoint(0).starts_with("https://"));

    let mut cfg = EtcdConfig::new(etcd.endpoints());
    cfg.lease_ttl = Duration::from_secs(2);
    cfg.tls = Some(client_tls.clone());
    let s = EtcdShards::connect(cfg.clone()).await.unwrap();
    assert_eq!(s.next_epoch("shard-t", 0).await.unwrap().epoch, 1);
    assert_eq!(s.next_epoch("shard-t", 0).await.unwrap().epoch, 2);

    // Bare host:port means https when TLS is configured.
    let mut bare = cfg.clone();
    bare.endpoints = vec![etcd.endpoint(0).trim_start_matches("https://").to_owned()];
    let s = EtcdShards::connect(bare).await.unwrap();
    assert_eq!(s.next_epoch("shard-t", 0).await.unwrap().epoch, 3);

    // Without a client certificate etcd refuses the handshake.
    let mut no_cert = cfg.clone();
    no_cert.tls = Some(EtcdTls {
        ca: client_tls.ca.clone(),
        cert: None,
        key: None,
    });
    let s = EtcdShards::connect(no_cert).await.unwrap();
    assert!(s.next_epoch("shard-t", 0).await.is_err());

    // A CA that did not sign etcd's certificate: refused too.
    let other = TestCa::new("other").unwrap();
    let other_dir = tempfile::tempdir().unwrap();
    let mut wrong_ca = cfg.clone();
    wrong_ca.tls = Some(EtcdTls {
        ca: other.write_ca(other_dir.path()).unwrap(),
        ..client_tls.clone()
    });
    let s = EtcdShards::connect(wrong_ca).await.unwrap();
    assert!(s.next_epoch("shard-t", 0).await.is_err());

    // Plain http endpoints with TLS configured are a configuration error.
    let mut mixed = cfg;
    mixed.endpoints = vec!["http://127.0.0.1:1".to_owned()];
    assert!(matches!(
        EtcdShards::connect(mixed).await,
        Err(ShardLeaseError::Etcd(_))
    ));
}
