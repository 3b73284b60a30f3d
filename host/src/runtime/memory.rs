//! Guest memory limits that remember a refused growth: a Rust guest whose
//! allocation fails aborts with `wasm trap: unreachable`, which alone does not
//! say why; the server turns "trapped after a refused growth" into a 413 that
//! names the limit.

use wasmtime::{ResourceLimiter, Result, StoreLimits, StoreLimitsBuilder};

pub struct GuestLimits {
    inner: StoreLimits,
    limit: usize,
    /// The size (bytes) of the first growth that was refused.
    refused: Option<usize>,
}

impl GuestLimits {
    /// At most `memory_limit` bytes per linear memory; a refused growth
    /// returns -1 to the guest (no trap here).
    pub fn new(memory_limit: usize) -> Self {
        GuestLimits {
            inner: StoreLimitsBuilder::new()
                .memory_size(memory_limit)
                .trap_on_grow_failure(false)
                .build(),
            limit: memory_limit,
            refused: None,
        }
    }

    /// Whether a memory growth was refused (the guest ran out of memory).
    pub fn refused(&self) -> bool {
        self.refused.is_some()
    }

    pub fn limit(&self) -> usize {
        self.limit
    }
}

impl ResourceLimiter for GuestLimits {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> Result<bool> {
        let ok = self.inner.memory_growing(current, desired, maximum)?;
        if !ok && self.refused.is_none() {
            self.refused = Some(desired);
        }
        Ok(ok)
    }

    fn memory_grow_failed(&mut self, error: wasmtime::Error) -> Result<()> {
        self.refused.get_or_insert(0);
        self.inner.memory_grow_failed(error)
    }

    fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> Result<bool> {
        self.inner.table_growing(current, desired, maximum)
    }

    fn instances(&self) -> usize {
        self.inner.instances()
    }

    fn tables(&self) -> usize {
        self.inner.tables()
    }

    fn memories(&self) -> usize {
        self.inner.memories()
    }
}

#[cfg(test)]
mod tests {
    use super::GuestLimits;
    use wasmtime::ResourceLimiter;

    #[test]
    fn records_a_refused_growth() {
        let mut l = GuestLimits::new(1 << 20);
        assert!(l.memory_growing(0, 1 << 16, None).unwrap());
        assert!(!l.refused());
        assert!(!l.memory_growing(1 << 16, 2 << 20, None).unwrap());
        assert!(l.refused());
        assert_eq!(l.limit(), 1 << 20);
    }
}
