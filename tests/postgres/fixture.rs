//! The sidecar in front of the kit's throwaway PostgreSQL
//! (`fencer_testkit::postgres`): its configuration, started in process.

use std::net::SocketAddr;
use std::path::Path;

use fencer_proxy::{ProxyConfig, ProxyHandle};
pub(crate) use fencer_testkit::free_addr;
pub(crate) use fencer_testkit::postgres::{
    SCRAM_PASSWORD, TestPostgres, code_of, connect, connect_as, require as require_postgres,
};

/// The sidecar in front of `pg`, in process, with `extra` appended to its
/// `[postgres]` table and `tables` after it.
pub(crate) async fn sidecar(pg: &TestPostgres, data: &Path, extra: &str, tables: &str) -> ProxyHandle {
    let text = sidecar_config(pg, data, extra, tables, "127.0.0.1:0".parse().unwrap());
    let config = ProxyConfig::from_toml_str(&text).unwrap_or_else(|e| panic!("sidecar config: {e}\n{text}"));
    fencer_proxy::start(config, Some(1)).await.expect("the sidecar starts")
}

/// The sidecar's `proxy.toml` for `pg`: resource `pg/{database}`, the
/// `reporting` role read-only, a 1 s quarantine.
pub(crate) fn sidecar_config(pg: &TestPostgres, data: &Path, extra: &str, tables: &str, listen: SocketAddr) -> String {
    format!(
        r#"
protocol = "postgres"
listen = "{listen}"
admin = "127.0.0.1:0"
data_dir = "{data}"

[timeouts]
quarantine = "1s"

[postgres]
upstream = "{upstream}"
resource = "pg/{{database}}"
read_only_users = ["reporting"]
{extra}

{tables}
"#,
        data = data.display(),
        upstream = pg.addr(),
    )
}

/// `[postgres.admin]` for the kit's `fencer_admin` role, the password in a
/// file.
pub(crate) fn admin_table(dir: &Path) -> String {
    let file = dir.join("pg-admin-password");
    std::fs::write(&file, format!("{SCRAM_PASSWORD}\n")).expect("write the admin password file");
    format!("[postgres.admin]\nuser = \"fencer_admin\"\npassword_file = \"{}\"\n", file.display())
}
