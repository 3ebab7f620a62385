//! Newtypes at the API edge: the fencing token and the lease id.

use std::fmt;

/// A fencing token: the raft log index of the entry that granted the lock
/// (DESIGN I2). Strictly larger than every token granted before, for any
/// resource. Send it with every write to the protected system.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken(pub u64);

impl FencingToken {
    /// The token as a number.
    pub fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A lease id: 32 hex digits chosen by the leader. It is the capability to
/// renew and release the lease, so `Debug` shows only its first digits;
/// `Display` and [`LeaseId::as_str`] give all of it.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct LeaseId(String);

impl LeaseId {
    pub(crate) fn new(id: String) -> Self {
        Self(id)
    }

    /// The full id.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for LeaseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let prefix: String = self.0.chars().take(6).collect();
        write!(f, "LeaseId({prefix}…)")
    }
}

impl fmt::Display for LeaseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_does_not_leak_the_lease_id() {
        let id = LeaseId::new("6cf4a1b2c3d4e5f60718293a4b5c6d7e".into());
        assert_eq!(format!("{id:?}"), "LeaseId(6cf4a1…)");
        assert_eq!(id.to_string(), "6cf4a1b2c3d4e5f60718293a4b5c6d7e");
    }
}
