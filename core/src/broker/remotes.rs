//! Remotes in the broker: read from the catalog, changed through the metadata store like
//! topics (durable before they are visible; on a cluster member through the replicated log).

use std::sync::Arc;

use crate::catalog::{Applied, CatalogCommand, RemoteMeta};

use super::{Broker, BrokerError};

impl Broker {
    /// Every remote, by name.
    pub fn remotes(&self) -> Vec<Arc<RemoteMeta>> {
        self.store.catalog().remotes().cloned().collect()
    }

    pub fn remote(&self, name: &str) -> Result<Arc<RemoteMeta>, BrokerError> {
        self.store
            .catalog()
            .remote(name)
            .cloned()
            .ok_or_else(|| BrokerError::RemoteNotFound(name.to_owned()))
    }

    /// Stores `remote`: a new one (`expect_version: None`) or a change of the one of its
    /// name and id still at `expect_version`. Returns it as stored (with its version).
    pub async fn put_remote(
        self: &Arc<Self>,
        remote: RemoteMeta,
        expect_version: Option<u64>,
    ) -> Result<Arc<RemoteMeta>, BrokerError> {
        self.check_running()?;
        let _guard = self.meta_lock.lock().await;
        let name = remote.name.clone();
        let id = remote.id;
        let cmd = CatalogCommand::PutRemote {
            remote,
            expect_version,
        };
        if self.store.replicated() {
            self.propose_replicated(cmd).await?;
            // (this node applied it: the catalog holds it unless a later change removed it)
            return self
                .store
                .catalog()
                .remote(&name)
                .filter(|r| r.id == id)
                .cloned()
                .ok_or(BrokerError::RemoteNotFound(name));
        }
        match self.commit(cmd, |_| {}).await? {
            Applied::Remote(r) => Ok(r),
            other => unreachable!("a remote put applied as {other:?}"),
        }
    }

    /// Removes the remote of id `remote_id`.
    pub async fn delete_remote(self: &Arc<Self>, remote_id: u64) -> Result<(), BrokerError> {
        self.check_running()?;
        let _guard = self.meta_lock.lock().await;
        let cmd = CatalogCommand::DeleteRemote { remote_id };
        if self.store.replicated() {
            return self.propose_replicated(cmd).await;
        }
        self.commit(cmd, |_| {}).await.map(|_| ())
    }
}
