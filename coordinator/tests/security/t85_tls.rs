//! TLS on the coordinator's port (issue 9 part B, docs/security.md): a
//! cluster whose raft traffic runs over mTLS forms and replicates; a
//! plaintext client is refused before any request is read; raft traffic
//! without a certificate from the peer CA is refused, and a node holding a
//! certificate from another CA never joins.

use std::path::Path;
use std::time::Duration;

use fencer_coordinator::{CertFiles, CertUse, DEFAULT_TLS_HANDSHAKE_TIMEOUT, DevCa, NodeTls};
use fencer_proto::raft::HelloRequest;
use fencer_proto::raft::raft_client::RaftClient;
use fencer_proto::v1::AcquireRequest;
use fencer_proto::v1::lock_client::LockClient;
use fencer_testkit::cluster::Cluster;
use fencer_testkit::{eventually, free_addr};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

struct Pki {
    _dir: tempfile::TempDir,
    peers: DevCa,
    clients: DevCa,
    node: CertFiles,
    alice: CertFiles,
}

fn pki() -> Pki {
    let dir = tempfile::tempdir().unwrap();
    let peers = DevCa::create(dir.path(), "peers").unwrap();
    let clients = DevCa::create(dir.path(), "clients").unwrap();
    let node = peers.issue("node", "node", &["127.0.0.1"], CertUse::Node).unwrap();
    let alice = clients.issue("alice", "alice", &[], CertUse::Client).unwrap();
    Pki { _dir: dir, peers, clients, node, alice }
}

fn node_tls(pki: &Pki, cert: &CertFiles) -> NodeTls {
    NodeTls {
        cert_file: cert.cert_file.clone(),
        key_file: cert.key_file.clone(),
        client_ca_file: Some(pki.clients.ca_file()),
        peer_ca_file: Some(pki.peers.ca_file()),
        handshake_timeout: DEFAULT_TLS_HANDSHAKE_TIMEOUT,
    }
}

async fn tls_channel(addr: &str, ca: &Path, me: Option<&CertFiles>) -> Result<Channel, tonic::transport::Error> {
    let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(std::fs::read(ca).unwrap()));
    if let Some(me) = me {
        tls = tls
            .identity(Identity::from_pem(std::fs::read(&me.cert_file).unwrap(), std::fs::read(&me.key_file).unwrap()));
    }
    Endpoint::from_shared(format!("https://{addr}"))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .timeout(Duration::from_secs(5))
        .connect()
        .await
}

fn acquire(resource: &str, request_id: &str) -> AcquireRequest {
    AcquireRequest {
        resource: resource.into(),
        request_id: request_id.into(),
        ttl_ms: Some(5_000),
        wait_timeout_ms: 0,
        holder: "t70".into(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t85_tls_cluster_replicates_and_refuses_plaintext() {
    let pki = pki();
    let tls = node_tls(&pki, &pki.node);
    let cluster = Cluster::start_with(3, |c| c.tls = Some(tls.clone())).await;
    let leader = cluster.leader(Duration::from_secs(10)).await;
    let addr = cluster.addr(leader);

    // A TLS client (verifying the node against the peer CA, which issued
    // the node's certificate) is served, and the grant replicates over TLS.
    let channel = tls_channel(&addr, &pki.peers.ca_file(), Some(&pki.alice)).await.unwrap();
    let granted = LockClient::new(channel).acquire(acquire("orders/1", "t70-request-1")).await.unwrap().into_inner();
    eventually("every replica applied the grant", Duration::from_secs(10), || async {
        cluster.ids().iter().all(|n| cluster.node(*n).applied_index() >= Some(granted.fencing_token)).then_some(())
    })
    .await;

    // The same call in plaintext fails: nothing answers it.
    let plain = Endpoint::from_shared(format!("http://{addr}")).unwrap().timeout(Duration::from_secs(5)).connect_lazy();
    // (The error the client reports varies: the connection closes, or the
    // server's TLS alert is read as a broken HTTP/2 frame.)
    let plain = LockClient::new(plain).acquire(acquire("orders/2", "t70-request-2")).await;
    assert!(plain.is_err(), "a plaintext acquire was answered: {plain:?}");

    // Plaintext HTTP/1 is closed without an HTTP answer.
    let mut tcp = tokio::net::TcpStream::connect(&addr).await.unwrap();
    tcp.write_all(b"GET /livez HTTP/1.1\r\nHost: fencer\r\n\r\n").await.unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), tcp.read_to_end(&mut answer)).await.expect("closed");
    assert!(
        !answer.starts_with(b"HTTP/"),
        "a plaintext request got an HTTP answer: {:?}",
        String::from_utf8_lossy(&answer)
    );

    // A client that does not trust the node's CA refuses the node.
    assert!(tls_channel(&addr, &pki.clients.ca_file(), None).await.is_err());

    // Nothing was granted for orders/2 anywhere.
    assert!(
        cluster.node(leader).state().resource(&fencer_coordinator::ResourceName::new("orders/2").unwrap()).is_none()
    );
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t86_raft_traffic_needs_a_peer_certificate() {
    let pki = pki();
    let tls = node_tls(&pki, &pki.node);
    let cluster = Cluster::start_with(1, |c| c.tls = Some(tls.clone())).await;
    let addr = cluster.addr(1);
    let hello = |channel: Channel| async move {
        RaftClient::new(channel).hello(HelloRequest { cluster_id: String::new(), from: 9 }).await
    };

    // A node's certificate (peer CA) is admitted.
    let ok = hello(tls_channel(&addr, &pki.peers.ca_file(), Some(&pki.node)).await.unwrap()).await.unwrap();
    assert_eq!(ok.into_inner().node_id, 1);
    // A client's certificate (client CA) and no certificate are not.
    for who in [Some(&pki.alice), None] {
        let err = hello(tls_channel(&addr, &pki.peers.ca_file(), who).await.unwrap()).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::PermissionDenied, "{who:?}: {err:?}");
    }

    // A node whose certificate comes from another CA greets the cluster
    // and never learns its cluster id, so it can neither join nor vote.
    let rogue_ca = DevCa::create(&cluster.scratch_dir("rogue"), "rogue").unwrap();
    let rogue_cert = rogue_ca.issue("rogue-node", "node", &["127.0.0.1"], CertUse::Node).unwrap();
    let mut rogue = cluster.config(1);
    rogue.node_id = 9;
    rogue.listen = free_addr();
    rogue.data_dir = cluster.scratch_dir("n9");
    rogue.peers.insert(9, rogue.listen.to_string());
    rogue.tls = Some(node_tls(&pki, &rogue_cert));
    let rogue = fencer_coordinator::Node::start(rogue).await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(rogue.cluster_id(), "", "the rogue node adopted the cluster");
    rogue.shutdown().await;
    cluster.shutdown().await;
}
